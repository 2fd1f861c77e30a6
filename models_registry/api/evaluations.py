"""The evaluation suites API: suites, their numbered versions (JSONL upload, copy, export) and cases.

Evaluators may write here (`evaluator_writable`), as admins may; viewers read. A version that an
evaluation run has used is frozen: any change to it or its cases answers 409 Conflict.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Count, QuerySet
from django.http import HttpResponse
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.base import AuditedModelViewSet, StrictModelSerializer, StrictSerializerMixin
from core.audit import record_audit
from core.choices import AuditAction
from models_registry.evaluation.models import EvalCase, EvalSuite, EvalSuiteVersion, SuiteVersionLocked
from models_registry.evaluation.rules import MATCH_RULES
from models_registry.evaluation.suites import (
    MAX_BYTES,
    MAX_ERRORS_SHOWN,
    ROLES,
    SuiteImportError,
    case_fields,
    copy_version,
    export_jsonl,
    import_jsonl,
    import_new_suite,
    refresh_version,
    validate_case,
)


class VersionLockedConflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "This suite version is used by an evaluation run and can no longer change."
    default_code = "suite_version_locked"


class LockedAs409Mixin:
    """Answer SuiteVersionLocked (raised by the models on any change to a used version) with 409."""

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, SuiteVersionLocked):
            exc = VersionLockedConflict(str(exc))
        return super().handle_exception(exc)  # type: ignore[misc]


# -- serializers ------------------------------------------------------------------------------------------


class EvalSuiteVersionSerializer(serializers.ModelSerializer):
    suite_name = serializers.CharField(source="suite.name", read_only=True)
    locked = serializers.BooleanField(read_only=True)

    class Meta:
        model = EvalSuiteVersion
        fields = [
            "id",
            "suite",
            "suite_name",
            "number",
            "note",
            "source",
            "case_count",
            "digest",
            "locked",
            "locked_at",
            "created_at",
        ]
        read_only_fields = fields


class EvalSuiteSerializer(StrictModelSerializer):
    version_count = serializers.IntegerField(read_only=True)
    latest_version = serializers.SerializerMethodField()

    class Meta:
        model = EvalSuite
        fields = [
            "id",
            "name",
            "description",
            "builtin",
            "version_count",
            "latest_version",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["id", "builtin", "version_count", "latest_version", "created_at", "updated_at"]

    @extend_schema_field(EvalSuiteVersionSerializer(allow_null=True))
    def get_latest_version(self, suite: EvalSuite) -> dict[str, Any] | None:
        latest = max(suite.versions.all(), key=lambda v: v.number, default=None)
        return dict(EvalSuiteVersionSerializer(latest).data) if latest is not None else None

    def validate_name(self, value: str) -> str:
        return clean_suite_name(value)


def clean_suite_name(value: str) -> str:
    name = value.strip()
    if not name or any(ch in name for ch in "/\\\n\t"):
        raise serializers.ValidationError("A suite name is one line without slashes.")
    return name


class UploadSerializer(StrictSerializerMixin, serializers.Serializer):
    """A JSONL upload: a multipart `file`, or the text itself as `jsonl`; an optional note."""

    file = serializers.FileField(required=False)
    jsonl = serializers.CharField(required=False, trim_whitespace=False)
    note = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)

    def validate(self, attrs: Any) -> Any:
        if ("file" in attrs) == ("jsonl" in attrs):
            raise serializers.ValidationError(
                {"file": ['Send the cases as "file" (JSONL) or as "jsonl" text.']}
            )
        upload = attrs.get("file")
        if upload is not None and upload.size > MAX_BYTES:
            raise serializers.ValidationError(
                {"file": [f"The file is larger than {MAX_BYTES // 1024**2} MiB."]}
            )
        return attrs


class SuiteImportSerializer(UploadSerializer):
    """A new suite and its first version in one request: the upload's fields plus the suite's own."""

    name = serializers.CharField(max_length=200)
    description = serializers.CharField(required=False, allow_blank=True, default="")

    def validate_name(self, value: str) -> str:
        name = clean_suite_name(value)
        if EvalSuite.objects.filter(name=name).exists():
            raise serializers.ValidationError(
                f"A suite named {name!r} exists; upload the file as a new version of it instead."
            )
        return name


class LineErrorSerializer(serializers.Serializer):
    line = serializers.IntegerField(help_text="1-based line of the file; 0 for the file as a whole.")
    message = serializers.CharField()


class UploadRefusedSerializer(serializers.Serializer):
    """A refused upload: the summary under the field that carried the file, and every line's problem."""

    file = serializers.ListField(child=serializers.CharField(), required=False)
    jsonl = serializers.ListField(child=serializers.CharField(), required=False)
    errors = LineErrorSerializer(many=True)  # type: ignore[assignment]


class CopySerializer(StrictSerializerMixin, serializers.Serializer):
    note = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


# Case fields as the API names them -> the names validate_case (and JSONL) uses.
API_TO_JSONL = {"case_id": "id"}
JSONL_TO_API = {"id": "case_id"}


# The case's JSON fields take anything so that validate_case can say per field what is wrong; their schema
# says what they hold once valid.
@extend_schema_field(
    {
        "type": "array",
        "nullable": True,
        "items": {
            "type": "object",
            "properties": {"role": {"type": "string", "enum": list(ROLES)}, "content": {"type": "string"}},
            "required": ["role", "content"],
        },
    }
)
class MessagesField(serializers.JSONField):
    pass


@extend_schema_field({"type": "string", "nullable": True, "description": "A number is stored as text."})
class ExpectedField(serializers.JSONField):
    pass


@extend_schema_field({"type": "string", "nullable": True, "enum": [*MATCH_RULES, None]})
class MatchRuleField(serializers.JSONField):
    def to_representation(self, value: Any) -> Any:
        return value or None  # stored as "" when the case has no expected answer


@extend_schema_field({"type": "array", "items": {"type": "string"}})
class TagsField(serializers.JSONField):
    pass


class EvalCaseSerializer(StrictModelSerializer):
    """A case; validated by the same rules as a JSONL line (suites.validate_case), errors per field."""

    version = serializers.PrimaryKeyRelatedField(queryset=EvalSuiteVersion.objects.all())
    prompt = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)
    messages = MessagesField(required=False, allow_null=True)
    expected = ExpectedField(required=False, allow_null=True)
    match_rule = MatchRuleField(required=False, allow_null=True)
    tags = TagsField(required=False)

    class Meta:
        model = EvalCase
        fields = [
            "id",
            "version",
            "case_id",
            "position",
            "prompt",
            "messages",
            "expected",
            "match_rule",
            "tags",
        ]
        read_only_fields = ["id"]
        extra_kwargs = {"position": {"required": False}}
        # validate() checks the id's uniqueness itself, with a message on the case_id field.
        validators: list[Any] = []

    def validate_version(self, version: EvalSuiteVersion) -> EvalSuiteVersion:
        if self.instance is not None and version.pk != self.instance.version_id:
            raise serializers.ValidationError("A case cannot move to another version.")
        return version

    def validate(self, attrs: Any) -> Any:
        current: dict[str, Any] = {}
        if self.instance is not None:
            inst = self.instance
            current = {
                "case_id": inst.case_id,
                "prompt": inst.prompt or None,
                "messages": inst.messages,
                "expected": inst.expected,
                "match_rule": inst.match_rule or None,
                "tags": inst.tags,
            }
        merged = {**current, **{k: v for k, v in attrs.items() if k not in ("version", "position")}}
        if merged.get("prompt") == "":
            merged["prompt"] = None
        obj = {API_TO_JSONL.get(k, k): v for k, v in merged.items() if v is not None}
        case, problems = validate_case(obj)
        if problems or case is None:
            errors: dict[str, list[str]] = {}
            for name, message in problems:
                errors.setdefault(JSONL_TO_API.get(name, name), []).append(message)
            raise serializers.ValidationError(errors)
        version = attrs.get("version") or self.instance.version  # type: ignore[union-attr]
        clash = EvalCase.objects.filter(version=version, case_id=case.case_id)
        if self.instance is not None:
            clash = clash.exclude(pk=self.instance.pk)
        if clash.exists():
            raise serializers.ValidationError(
                {"case_id": [f"Id {case.case_id!r} is already used in {version}."]}
            )
        out: dict[str, Any] = dict(case_fields(case))
        if "version" in attrs:
            out["version"] = attrs["version"]
        if "position" in attrs:
            out["position"] = attrs["position"]
        elif self.instance is None:
            last = EvalCase.objects.filter(version=version).order_by("-position").first()
            out["position"] = last.position + 1 if last else 0
        return out


# -- views ------------------------------------------------------------------------------------------------


class EvalSuiteViewSet(LockedAs409Mixin, AuditedModelViewSet):
    """Evaluation suites. POST .../upload/ adds a version from JSONL (refused whole on any bad line)."""

    evaluator_writable = True
    serializer_class = EvalSuiteSerializer
    search_fields = ["name", "description"]
    filterset_fields = ["builtin"]
    ordering_fields = ["name", "created_at"]
    parser_classes = [JSONParser, MultiPartParser, FormParser]

    def get_queryset(self) -> QuerySet[EvalSuite]:
        return EvalSuite.objects.annotate(version_count=Count("versions")).prefetch_related("versions__suite")

    def perform_create(self, serializer: Any) -> None:
        serializer.validated_data["created_by"] = self.request.user
        super().perform_create(serializer)

    def perform_destroy(self, instance: EvalSuite) -> None:
        locked = instance.versions.filter(locked_at__isnull=False).first()
        if locked is not None:
            raise SuiteVersionLocked(locked)
        super().perform_destroy(instance)

    @extend_schema(
        request=UploadSerializer,
        responses={201: EvalSuiteVersionSerializer, 400: UploadRefusedSerializer},
    )
    @action(detail=True, methods=["post"])
    def upload(self, request: Request, pk: str | None = None) -> Response:
        """A JSONL file (or text) becomes the suite's next version; any bad line refuses the whole file."""
        suite = self.get_object()
        body = UploadSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            version = import_jsonl(suite, upload_text(data), note=data["note"], actor=request.user)
        except SuiteImportError as exc:
            return upload_refused(data, exc)
        return Response(EvalSuiteVersionSerializer(version).data, status=201)

    @extend_schema(
        request=SuiteImportSerializer,
        responses={201: EvalSuiteSerializer, 400: UploadRefusedSerializer},
    )
    @action(detail=False, methods=["post"], url_path="import")
    def import_suite(self, request: Request) -> Response:
        """A new suite with its first version from JSONL; a bad line refuses both (no empty suite left)."""
        body = SuiteImportSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            suite = import_new_suite(
                data["name"],
                upload_text(data),
                description=data["description"],
                note=data["note"],
                actor=request.user,
            )
        except SuiteImportError as exc:
            return upload_refused(data, exc)
        except IntegrityError:  # the same name, created by another request since validation
            return Response({"name": ["A suite with this name exists."]}, status=status.HTTP_400_BAD_REQUEST)
        return Response(self.get_serializer(self.get_queryset().get(pk=suite.pk)).data, status=201)


def upload_text(data: dict[str, Any]) -> str | bytes:
    return data["file"].read() if "file" in data else data["jsonl"]


def upload_refused(data: dict[str, Any], exc: SuiteImportError) -> Response:
    # A plain 400 body (ValidationError would turn the line numbers into strings).
    field = "file" if "file" in data else "jsonl"
    return Response(
        {field: [str(exc)], "errors": [e.as_dict() for e in exc.errors[:MAX_ERRORS_SHOWN]]},
        status=status.HTTP_400_BAD_REQUEST,
    )


class EvalSuiteVersionViewSet(
    LockedAs409Mixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Suite versions: made by upload or copy, deleted only while no run has used them."""

    evaluator_writable = True
    serializer_class = EvalSuiteVersionSerializer
    filterset_fields = ["suite"]
    ordering_fields = ["number", "created_at"]

    def get_queryset(self) -> QuerySet[EvalSuiteVersion]:
        return EvalSuiteVersion.objects.select_related("suite")

    def perform_destroy(self, instance: EvalSuiteVersion) -> None:
        with transaction.atomic():
            record_audit(
                actor=self.request.user,
                action=AuditAction.DELETE,
                obj=instance,
                before=dict(self.get_serializer(instance).data),
            )
            instance.delete()

    @extend_schema(request=CopySerializer, responses={201: EvalSuiteVersionSerializer})
    @action(detail=True, methods=["post"])
    def copy(self, request: Request, pk: str | None = None) -> Response:
        """A new draft version with the same cases: how a frozen (used) version gets changed."""
        version = self.get_object()
        body = CopySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        new = copy_version(version, note=body.validated_data["note"], actor=request.user)
        return Response(self.get_serializer(new).data, status=201)

    @extend_schema(responses={(200, "application/x-ndjson"): str})
    @action(detail=True, methods=["get"])
    def export(self, request: Request, pk: str | None = None) -> HttpResponse:
        """The version's cases as a JSONL download (uploading it again gives the same digest)."""
        version = self.get_object()
        response = HttpResponse(export_jsonl(version), content_type="application/x-ndjson; charset=utf-8")
        response["Content-Disposition"] = (
            f'attachment; filename="{version.suite.name}-v{version.number}.jsonl"'
        )
        return response


class EvalCaseViewSet(LockedAs409Mixin, AuditedModelViewSet):
    """Cases of suite versions; writable while their version is a draft. Filter with ?version=."""

    evaluator_writable = True
    serializer_class = EvalCaseSerializer
    filterset_fields = ["version", "match_rule"]
    search_fields = ["case_id", "prompt"]
    ordering_fields = ["position", "case_id"]

    def get_queryset(self) -> QuerySet[EvalCase]:
        return EvalCase.objects.select_related("version__suite")

    def perform_create(self, serializer: Any) -> None:
        with transaction.atomic():
            super().perform_create(serializer)
            refresh_version(serializer.instance.version)

    def perform_update(self, serializer: Any) -> None:
        with transaction.atomic():
            super().perform_update(serializer)
            refresh_version(serializer.instance.version)

    def perform_destroy(self, instance: EvalCase) -> None:
        version = instance.version
        with transaction.atomic():
            super().perform_destroy(instance)
            refresh_version(version)
