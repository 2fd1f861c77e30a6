from __future__ import annotations

from typing import Any

from django.db.models import Count, ProtectedError, QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action, api_view, permission_classes
from rest_framework.exceptions import ValidationError
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.base import AuditedModelViewSet
from core.audit import record_audit
from core.choices import AuditAction
from core.redis_client import publish_config_change
from models_registry.api.eval_runs import EvalVerdictSerializer
from models_registry.api.serializers import (
    FitCheckSerializer,
    FitResultSerializer,
    LineageNodeSerializer,
    ManifestFileSerializer,
    ModelAliasSerializer,
    ModelSerializer,
    ModelVersionSerializer,
    QuantizationConfigSerializer,
    QuantizeQueuedSerializer,
    QuantizeRequestSerializer,
    RegisterVersionSerializer,
    SwitchAliasSerializer,
    VerificationRunSerializer,
    VerifyQueuedSerializer,
    VerifyRequestSerializer,
)
from models_registry.estimate import DEFAULT_OVERHEAD_BYTES
from models_registry.evaluation.models import EvalVerdict
from models_registry.models import Model, ModelAlias, ModelVersion, QuantizationConfig
from models_registry.quantize import QuantizeError, check_request, default_revision, output_path
from models_registry.services import (
    ArchitectureError,
    ManifestError,
    RegistrationError,
    SourcePathError,
    fit_check,
    latest_runs,
    parse_manifest,
    register_version,
    switch_alias,
)
from models_registry.tasks import enqueue_quantize, enqueue_verification


def protected_error(exc: ProtectedError) -> ValidationError:
    users = sorted({str(obj) for obj in exc.protected_objects})[:5]
    return ValidationError(
        {"non_field_errors": [f"Still in use by: {', '.join(users)}. Remove those first."]}
    )


class ProtectedDeleteMixin:
    """Turn a delete refused by an on_delete=PROTECT reference into a 400 that names the users."""

    def perform_destroy(self, instance: Any) -> None:
        try:
            super().perform_destroy(instance)  # type: ignore[misc]
        except ProtectedError as exc:
            raise protected_error(exc) from None


class RegistryModelViewSet(ProtectedDeleteMixin, AuditedModelViewSet):
    """Model families."""

    serializer_class = ModelSerializer
    search_fields = ["name", "architecture", "description"]
    ordering_fields = ["name", "created_at"]

    def get_queryset(self) -> QuerySet[Model]:
        return Model.objects.annotate(version_count=Count("versions"))


class QuantizationConfigViewSet(ProtectedDeleteMixin, AuditedModelViewSet):
    """Quantization configs: method, bits, group size and KV-cache dtype."""

    serializer_class = QuantizationConfigSerializer
    queryset = QuantizationConfig.objects.all()
    filterset_fields = ["method"]
    search_fields = ["name", "description"]


def lineage_node(version: ModelVersion, children: dict[int | None, list[ModelVersion]]) -> dict[str, Any]:
    return {
        "id": version.pk,
        "label": str(version),
        "model": version.model_id,
        "revision": version.revision,
        "state": version.state,
        "quantization": version.quantization.name if version.quantization else None,
        "method": version.quantization.method if version.quantization else None,
        "children": [lineage_node(child, children) for child in children.get(version.pk, [])],
    }


class ModelVersionViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet
):
    """Model versions. POST registers one (hashing its files); versions are never edited afterwards."""

    serializer_class = ModelVersionSerializer
    filterset_fields = ["model", "state", "source_kind", "quantization", "parent"]
    search_fields = ["revision", "model__name", "source_path"]
    ordering_fields = ["created_at", "revision"]
    parser_classes = [JSONParser, MultiPartParser, FormParser]

    def get_queryset(self) -> QuerySet[ModelVersion]:
        return ModelVersion.objects.select_related("model", "quantization", "parent__model").prefetch_related(
            "aliases"
        )

    @extend_schema(request=RegisterVersionSerializer, responses={201: ModelVersionSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Register a version from a server-side path under the model roots; all or nothing."""
        serializer = RegisterVersionSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        text = data.get("manifest") or data.get("manifest_file")
        field = "manifest" if "manifest" in data else "manifest_file"
        try:
            manifest = parse_manifest(text) if text else None
        except ManifestError as exc:
            raise ValidationError({field: [str(exc)]}) from None
        try:
            version = register_version(
                model=data["model"],
                revision=data["revision"],
                source_path=data["source_path"],
                manifest=manifest,
                quantization=data.get("quantization"),
                parent=data.get("parent"),
                parameter_count=data.get("parameter_count"),
                max_context=data.get("max_context"),
                actor=request.user,
            )
        except SourcePathError as exc:
            raise ValidationError({"source_path": [str(exc)]}) from None
        except ArchitectureError as exc:
            raise ValidationError({"source_path": [str(exc)]}) from None
        except RegistrationError as exc:
            body: dict[str, Any] = {"source_path": [str(exc)]}
            if exc.problems:
                body["problems"] = exc.problems
            raise ValidationError(body) from None
        return Response(self.get_serializer(self.get_queryset().get(pk=version.pk)).data, status=201)

    def perform_destroy(self, instance: ModelVersion) -> None:
        try:
            record_audit(
                actor=self.request.user,
                action=AuditAction.DELETE,
                obj=instance,
                before={"version": str(instance), "manifest_digest": instance.manifest_digest},
            )
            instance.delete()
        except ProtectedError as exc:
            raise protected_error(exc) from None

    @extend_schema(responses={200: ManifestFileSerializer(many=True)})
    @action(detail=True, methods=["get"], filter_backends=[])
    def files(self, request: Request, pk: str | None = None) -> Response:
        """The manifest: path, size and sha256 of every pinned file (paginated)."""
        version = self.get_object()
        page = self.paginate_queryset(version.files.all())
        return self.get_paginated_response(ManifestFileSerializer(page, many=True).data)

    @extend_schema(
        parameters=[OpenApiParameter("host_name", str, description="Only runs on this host.")],
        responses={200: VerificationRunSerializer(many=True)},
    )
    @action(detail=True, methods=["get"], filter_backends=[])
    def verifications(self, request: Request, pk: str | None = None) -> Response:
        """Verification history, newest first; `?host_name=` narrows it to one host."""
        version = self.get_object()
        runs = version.verifications.all()
        host = request.query_params.get("host_name")
        if host:
            # PostgreSQL refuses NUL in text: the query would fail as a 500 instead of matching nothing.
            if "\x00" in host:
                raise ValidationError({"host_name": ["Null characters are not allowed."]})
            runs = runs.filter(host_name=host)
        page = self.paginate_queryset(runs)
        return self.get_paginated_response(VerificationRunSerializer(page, many=True).data)

    @extend_schema(responses={200: VerificationRunSerializer(many=True)})
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def hosts(self, request: Request, pk: str | None = None) -> Response:
        """The latest verification run per host: where this version may be deployed."""
        version = self.get_object()
        latest = sorted(latest_runs(version).values(), key=lambda r: r.host_name)
        return Response(VerificationRunSerializer(latest, many=True).data)

    @extend_schema(
        parameters=[
            OpenApiParameter("current", bool, description="Only verdicts in force (or only superseded).")
        ],
        responses={200: EvalVerdictSerializer(many=True)},
    )
    @action(detail=True, methods=["get"], filter_backends=[])
    def verdicts(self, request: Request, pk: str | None = None) -> Response:
        """Evaluation verdicts signed on runs whose candidate was this version, newest first (paginated)."""
        version = self.get_object()
        rows = EvalVerdict.objects.filter(candidate_version=version).select_related(
            "run__suite_version__suite", "candidate_version__model"
        )
        current = request.query_params.get("current")
        if current in ("true", "false"):
            rows = rows.filter(superseded_at__isnull=current == "true")
        elif current:
            raise ValidationError({"current": ["Must be true or false."]})
        page = self.paginate_queryset(rows)
        return self.get_paginated_response(EvalVerdictSerializer(page, many=True).data)

    @extend_schema(request=VerifyRequestSerializer, responses={202: VerifyQueuedSerializer})
    @action(detail=True, methods=["post"])
    def verify(self, request: Request, pk: str | None = None) -> Response:
        """Queue a re-hash of the files on `host_name` (its node agent, queue node.<host>)."""
        version = self.get_object()
        body = VerifyRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        host = body.validated_data["host_name"].strip()
        if not host or any(ch.isspace() for ch in host):
            raise ValidationError({"host_name": ["A host name has no spaces."]})
        record_audit(
            actor=request.user,
            action=AuditAction.ACTION,
            obj=version,
            after={"verify_on": host},
        )
        enqueue_verification(version, host)
        queued = {"queued": True, "host_name": host, "queue": f"node.{host}"}
        return Response(VerifyQueuedSerializer(queued).data, status=202)

    @extend_schema(request=QuantizeRequestSerializer, responses={202: QuantizeQueuedSerializer})
    @action(detail=True, methods=["post"])
    def quantize(self, request: Request, pk: str | None = None) -> Response:
        """Make a lower-bit GGUF from this GGUF version (llama.cpp's quantizer) and register it as a new
        version whose lineage parent is this one; admins only, audited, run by a Celery task."""
        source = self.get_object()
        body = QuantizeRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        target = body.validated_data["target_type"]
        revision = body.validated_data.get("revision") or default_revision(source, target)
        try:
            check_request(source, target, revision)
        except QuantizeError as exc:
            raise ValidationError({exc.field: [str(exc)]}) from None
        out = str(output_path(source, target))
        record_audit(
            actor=request.user,
            action=AuditAction.ACTION,
            obj=source,
            after={"quantize": target, "revision": revision, "output_path": out},
        )
        enqueue_quantize(source, target, revision, body.validated_data["nthread"], request.user)
        queued = {
            "queued": True,
            "source": source.pk,
            "target_type": target,
            "revision": revision,
            "output_path": out,
        }
        return Response(QuantizeQueuedSerializer(queued).data, status=202)

    @extend_schema(responses={200: LineageNodeSerializer(many=True)})
    @action(detail=False, methods=["get"], pagination_class=None)
    def lineage(self, request: Request) -> Response:
        """Versions as a forest: each full-precision version with the quantized versions made from it."""
        versions = list(self.filter_queryset(self.get_queryset()).order_by("created_at"))
        ids = {v.pk for v in versions}
        children: dict[int | None, list[ModelVersion]] = {}
        for v in versions:
            parent = v.parent_id if v.parent_id in ids else None
            children.setdefault(parent, []).append(v)
        roots = [lineage_node(v, children) for v in children.get(None, [])]
        return Response(LineageNodeSerializer(roots, many=True).data)


class ModelAliasViewSet(ProtectedDeleteMixin, AuditedModelViewSet):
    """Aliases: the names tenants send, each pointing at one active version."""

    serializer_class = ModelAliasSerializer
    search_fields = ["name", "description"]
    filterset_fields = ["active_version"]

    def get_queryset(self) -> QuerySet[ModelAlias]:
        return ModelAlias.objects.select_related("active_version__model")

    def perform_create(self, serializer: Any) -> None:
        super().perform_create(serializer)
        publish_config_change("model_alias", name=serializer.instance.name)

    def perform_destroy(self, instance: Any) -> None:
        name = instance.name
        super().perform_destroy(instance)
        publish_config_change("model_alias", name=name)

    @extend_schema(request=SwitchAliasSerializer, responses={200: ModelAliasSerializer})
    @action(detail=True, methods=["post"])
    def switch(self, request: Request, pk: str | None = None) -> Response:
        """Point the alias at another version; audited and pushed to every proxy at once."""
        alias = self.get_object()
        body = SwitchAliasSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            updated = switch_alias(alias, body.validated_data["version"], actor=request.user)
        except RegistrationError as exc:
            raise ValidationError({"version": [str(exc)]}) from None
        return Response(self.get_serializer(self.get_queryset().get(pk=updated.pk)).data)


@extend_schema(request=FitCheckSerializer, responses={200: FitResultSerializer})
@api_view(["POST"])
@permission_classes([IsAuthenticated])
def fit_check_view(request: Request) -> Response:
    """Will this version fit on this GPU? Writes nothing, so every signed-in role may ask."""
    body = FitCheckSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    data = body.validated_data
    memory = data.get("gpu_memory_bytes") or int(data["gpu_memory_gib"] * 1024**3)
    quantization = data.get("quantization") or data.get("method") or None
    try:
        result = fit_check(
            data["version"],
            quantization,
            gpu_memory_bytes=memory,
            gpu_memory_utilization=data["gpu_memory_utilization"],
            max_model_len=data["max_model_len"],
            max_num_seqs=data["max_num_seqs"],
            other_reserved_bytes=data["other_reserved_bytes"],
            overhead_bytes=data.get("overhead_bytes", DEFAULT_OVERHEAD_BYTES),
            kv_cache_dtype=data.get("kv_cache_dtype") or None,
            tensor_parallel_size=data["tensor_parallel_size"],
            pipeline_parallel_size=data["pipeline_parallel_size"],
            gpu_name=data["gpu_name"],
            max_num_batched_tokens=data["max_num_batched_tokens"],
        )
    except ArchitectureError as exc:
        raise ValidationError({"version": [str(exc)]}) from None
    return Response(FitResultSerializer(result).data, status=status.HTTP_200_OK)
