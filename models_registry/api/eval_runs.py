"""The evaluation runs API: start a run, follow it, list its samples, cancel or resume it.

Evaluators and admins start and cancel runs (`evaluator_writable`); viewers read. A side is a fleet
deployment (by id, resolved through models_registry.evaluation.endpoints) or the base URL and served
name of a keyless OpenAI-compatible engine. Without a reference, the candidate deployment's lineage
parent is used, wherever it is deployed.
"""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction
from django.db.models import F, Q, QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.base import StrictSerializerMixin
from core.audit import record_audit
from core.choices import AuditAction
from models_registry.evaluation import endpoints
from models_registry.evaluation.models import EvalRun, EvalSample, EvalSuiteVersion, RunState
from models_registry.evaluation.runner import run_group
from models_registry.models import ModelVersion
from models_registry.tasks import enqueue_evaluation

SIDES = ("reference", "candidate")
SAMPLE_ORDERS = ("position", "worst_kl", "longest_divergence", "lowest_chrf")


# -- the summary's shape (runner.run_summary), so clients read it from the schema ---------------------------


class FlipTableSerializer(serializers.Serializer):
    both_right = serializers.IntegerField()
    right_to_wrong = serializers.IntegerField()
    wrong_to_right = serializers.IntegerField()
    both_wrong = serializers.IntegerField()
    confidence = serializers.FloatField()
    n = serializers.IntegerField()
    reference_accuracy = serializers.FloatField(allow_null=True)
    candidate_accuracy = serializers.FloatField(allow_null=True)
    flips = serializers.IntegerField()
    flip_rate = serializers.FloatField(allow_null=True)
    accuracy_difference = serializers.FloatField(allow_null=True)
    difference_ci = serializers.ListField(
        child=serializers.FloatField(), allow_null=True, help_text="[low, high] of the accuracy difference."
    )


class DistributionSummarySerializer(serializers.Serializer):
    samples = serializers.IntegerField()
    positions = serializers.IntegerField()
    top1_agreement = serializers.FloatField()
    mean_kl = serializers.FloatField()


class StatsSerializer(serializers.Serializer):
    mean = serializers.FloatField(allow_null=True)
    p50 = serializers.FloatField(allow_null=True)
    p95 = serializers.FloatField(allow_null=True)


class SideTimingsSerializer(serializers.Serializer):
    latency_ms = StatsSerializer()
    tokens_per_s = StatsSerializer()
    ttft_ms = StatsSerializer()


class RunSummarySerializer(serializers.Serializer):
    """A finished run's figures (docs/evaluations.md, "Runs"); empty ({}) until the run ends."""

    samples = serializers.IntegerField(required=False)
    exact_match_rate = serializers.FloatField(required=False, allow_null=True)
    token_agreement = serializers.FloatField(required=False, allow_null=True)
    chrf = serializers.FloatField(required=False, allow_null=True)
    length_difference = serializers.FloatField(required=False, allow_null=True)
    flips = FlipTableSerializer(required=False, allow_null=True)
    distributions = serializers.DictField(
        child=DistributionSummarySerializer(),
        required=False,
        help_text="Per KL mode: teacher_forced, free_running_topk.",
    )
    reference = SideTimingsSerializer(required=False)
    candidate = SideTimingsSerializer(required=False)
    errors = serializers.IntegerField(required=False)  # type: ignore[assignment]


def side_label(info: dict[str, Any], base_url: str, model: str) -> str:
    """ "llama-q4 (llama@q4)" for a fleet deployment, "ref at http://host:8001" for a plain URL."""
    if info.get("deployment"):
        version = f"{info.get('model', '')}@{info.get('revision', '')}".strip("@")
        return f"{info['deployment']} ({version})" if version else str(info["deployment"])
    return f"{model} at {base_url}"


class EvalRunSerializer(serializers.ModelSerializer):
    suite = serializers.IntegerField(source="suite_version.suite_id", read_only=True)
    suite_name = serializers.CharField(source="suite_version.suite.name", read_only=True)
    suite_version_number = serializers.IntegerField(source="suite_version.number", read_only=True)
    reference_label = serializers.SerializerMethodField()
    candidate_label = serializers.SerializerMethodField()
    summary = serializers.SerializerMethodField()
    created_by_name = serializers.CharField(
        source="created_by.username", read_only=True, allow_null=True, default=None
    )
    sampling = serializers.SerializerMethodField()
    live_group = serializers.SerializerMethodField()

    class Meta:
        model = EvalRun
        fields = [
            "id",
            "name",
            "suite_version",
            "suite",
            "suite_name",
            "suite_version_number",
            "reference_deployment_id",
            "reference_base_url",
            "reference_model",
            "reference_info",
            "candidate_deployment_id",
            "candidate_base_url",
            "candidate_model",
            "candidate_info",
            "sampling",
            "max_tokens",
            "seed",
            "top_logprobs",
            "concurrency",
            "request_timeout",
            "state",
            "cancel_requested",
            "case_count",
            "done_count",
            "error_count",
            "attempts",
            "summary",
            "teacher_forcing_note",
            "error",
            "live_group",
            "reference_label",
            "candidate_label",
            "created_by_name",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_sampling(self, run: EvalRun) -> dict[str, Any]:
        return run.sampling()

    def get_reference_label(self, run: EvalRun) -> str:
        return side_label(run.reference_info, run.reference_base_url, run.reference_model)

    def get_candidate_label(self, run: EvalRun) -> str:
        return side_label(run.candidate_info, run.candidate_base_url, run.candidate_model)

    @extend_schema_field(RunSummarySerializer)
    def get_summary(self, run: EvalRun) -> dict[str, Any]:
        return dict(run.summary or {})

    def get_live_group(self, run: EvalRun) -> str:
        return run_group(run.pk)


class RunCreateSerializer(StrictSerializerMixin, serializers.Serializer):
    """A new run. Each side: `*_deployment` (a fleet deployment id) or `*_base_url` + `*_model`."""

    name = serializers.CharField(required=False, allow_blank=True, default="", max_length=200)
    suite_version = serializers.PrimaryKeyRelatedField(queryset=EvalSuiteVersion.objects.all())
    reference_deployment = serializers.IntegerField(required=False, allow_null=True, min_value=1)
    reference_base_url = serializers.URLField(required=False, allow_blank=True, max_length=500)
    reference_model = serializers.CharField(required=False, allow_blank=True, max_length=200)
    candidate_deployment = serializers.IntegerField(required=False, allow_null=True, min_value=1)
    candidate_base_url = serializers.URLField(required=False, allow_blank=True, max_length=500)
    candidate_model = serializers.CharField(required=False, allow_blank=True, max_length=200)
    max_tokens = serializers.IntegerField(required=False, default=256, min_value=1, max_value=8192)
    seed = serializers.IntegerField(required=False, default=0, min_value=0, max_value=2**63 - 1)
    top_logprobs = serializers.IntegerField(required=False, default=5, min_value=0, max_value=20)
    concurrency = serializers.IntegerField(required=False, default=8, min_value=1, max_value=64)
    request_timeout = serializers.FloatField(required=False, default=120.0, min_value=1.0, max_value=600.0)

    def validate_suite_version(self, version: EvalSuiteVersion) -> EvalSuiteVersion:
        if version.case_count == 0 and not version.cases.exists():
            raise serializers.ValidationError("This suite version has no cases.")
        return version

    def _side(self, attrs: dict[str, Any], side: str) -> dict[str, Any] | None:
        """The side's endpoint fields, or None when nothing was given for it."""
        dep = attrs.get(f"{side}_deployment")
        url = (attrs.get(f"{side}_base_url") or "").rstrip("/")
        model = (attrs.get(f"{side}_model") or "").strip()
        if dep is not None:
            if url or model:
                raise serializers.ValidationError(
                    {f"{side}_deployment": ["Give a deployment or a base URL and model, not both."]}
                )
            try:
                ep = endpoints.deployment_endpoint(dep)
            except endpoints.EndpointUnavailable as exc:
                raise serializers.ValidationError({f"{side}_deployment": [str(exc)]}) from exc
            return {"deployment_id": dep, "base_url": ep.base_url, "model": ep.model, "info": ep.info}
        if url or model:
            errors = {}
            if not url:
                errors[f"{side}_base_url"] = ["Required with a model name."]
            if not model:
                errors[f"{side}_model"] = ["Required with a base URL (the engine's served model name)."]
            if errors:
                raise serializers.ValidationError(errors)
            return {"deployment_id": None, "base_url": url, "model": model, "info": {"base_url": url}}
        return None

    def validate(self, attrs: Any) -> Any:
        candidate = self._side(attrs, "candidate")
        if candidate is None:
            raise serializers.ValidationError(
                {"candidate_deployment": ["Give the candidate: a deployment, or a base URL and model."]}
            )
        reference = self._side(attrs, "reference")
        if reference is None:
            if candidate["deployment_id"] is None:
                raise serializers.ValidationError(
                    {"reference_deployment": ["Give the reference: a deployment, or a base URL and model."]}
                )
            reference = lineage_reference(candidate["deployment_id"])
        attrs["sides"] = {"reference": reference, "candidate": candidate}
        return attrs


def lineage_reference(candidate_deployment: int) -> dict[str, Any]:
    """The default reference: a ready deployment of the candidate version's lineage parent.

    Raises a ValidationError on `reference_deployment` saying why there is none.
    """
    resolver = endpoints.resolver()
    missing = "Give the reference: a deployment, or a base URL and model"
    if resolver is None:
        raise serializers.ValidationError({"reference_deployment": [missing + "."]})
    version_id = resolver.model_version_of(candidate_deployment)
    parent_id = ModelVersion.objects.filter(pk=version_id or 0).values_list("parent_id", flat=True).first()
    if parent_id is None:
        raise serializers.ValidationError(
            {"reference_deployment": [missing + " (the candidate's version has no lineage parent)."]}
        )
    dep = resolver.deployment_of_version(parent_id)
    if dep is None:
        raise serializers.ValidationError(
            {"reference_deployment": [missing + " (the lineage parent is not deployed and ready)."]}
        )
    ep = endpoints.deployment_endpoint(dep)
    return {"deployment_id": dep, "base_url": ep.base_url, "model": ep.model, "info": ep.info}


class DefaultReferenceQuerySerializer(StrictSerializerMixin, serializers.Serializer):
    candidate_deployment = serializers.IntegerField(min_value=1)


class DefaultReferenceSerializer(serializers.Serializer):
    """The reference a run gets when none is given, for a given candidate deployment."""

    deployment_id = serializers.IntegerField()
    label = serializers.CharField()  # type: ignore[assignment]
    model_version_id = serializers.IntegerField(allow_null=True)


class EvalSampleSerializer(serializers.ModelSerializer):
    class Meta:
        model = EvalSample
        fields = [
            "id",
            "run",
            "case",
            "case_key",
            "position",
            "tags",
            "reference_output",
            "candidate_output",
            "reference_tokens",
            "candidate_tokens",
            "reference_token_logprobs",
            "candidate_token_logprobs",
            "position_kl",
            "exact_match",
            "first_divergence",
            "token_agreement",
            "chrf",
            "reference_correct",
            "candidate_correct",
            "flip",
            "kl_mode",
            "mean_kl",
            "max_kl",
            "top1_agreement",
            "scores",
            "reference_latency_ms",
            "candidate_latency_ms",
            "reference_ttft_ms",
            "candidate_ttft_ms",
            "reference_tokens_per_s",
            "candidate_tokens_per_s",
            "error",
            "created_at",
        ]
        read_only_fields = fields


class SampleQuerySerializer(StrictSerializerMixin, serializers.Serializer):
    differs = serializers.BooleanField(required=False, allow_null=True, default=None)
    flipped = serializers.ChoiceField(
        required=False, choices=["any", "right_to_wrong", "wrong_to_right"], allow_blank=True
    )
    tag = serializers.CharField(required=False, allow_blank=True)
    errors = serializers.BooleanField(  # type: ignore[assignment]
        required=False, allow_null=True, default=None
    )
    order = serializers.ChoiceField(
        required=False,
        choices=["position", "worst_kl", "longest_divergence", "lowest_chrf"],
        default="position",
    )
    limit = serializers.IntegerField(required=False, min_value=1, max_value=500)
    offset = serializers.IntegerField(required=False, min_value=0)


class EvalRunViewSet(
    mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    """Evaluation runs: POST starts one (a Celery task runs it); GET lists them with their summaries."""

    evaluator_writable = True
    serializer_class = EvalRunSerializer
    filterset_fields = ["state", "suite_version", "reference_deployment_id", "candidate_deployment_id"]
    search_fields = ["name", "reference_model", "candidate_model"]
    ordering_fields = ["created_at", "finished_at"]

    def get_queryset(self) -> QuerySet[EvalRun]:
        return EvalRun.objects.select_related("suite_version__suite", "created_by")

    @extend_schema(request=RunCreateSerializer, responses={201: EvalRunSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        body = RunCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        version: EvalSuiteVersion = data["suite_version"]
        sides = data["sides"]
        with transaction.atomic():
            # A used version is frozen from here on: its cases are what this run measures.
            version.lock()
            run = EvalRun.objects.create(
                name=data["name"],
                suite_version=version,
                **{
                    f"{side}_{name}": sides[side][name]
                    for side in SIDES
                    for name in ("deployment_id", "base_url", "model", "info")
                },
                max_tokens=data["max_tokens"],
                seed=data["seed"],
                top_logprobs=data["top_logprobs"],
                concurrency=data["concurrency"],
                request_timeout=data["request_timeout"],
                case_count=version.cases.count(),
                created_by=request.user if request.user.is_authenticated else None,
            )
            out = dict(self.get_serializer(run).data)
            record_audit(actor=request.user, action=AuditAction.CREATE, obj=run, after=out)
            enqueue_evaluation(run.pk)
        return Response(out, status=status.HTTP_201_CREATED)

    @extend_schema(
        parameters=[DefaultReferenceQuerySerializer],
        responses={200: DefaultReferenceSerializer},
    )
    @action(detail=False, methods=["get"], url_path="default-reference", filter_backends=[])
    def default_reference(self, request: Request) -> Response:
        """The reference a new run would get for this candidate deployment (its lineage parent's ready
        deployment), or 400 on `reference_deployment` saying why there is none."""
        query = DefaultReferenceQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        candidate = query.validated_data["candidate_deployment"]
        try:
            endpoints.deployment_endpoint(candidate)
        except endpoints.EndpointUnavailable as exc:
            raise serializers.ValidationError({"candidate_deployment": [str(exc)]}) from exc
        ref = lineage_reference(candidate)
        info = ref["info"]
        return Response(
            DefaultReferenceSerializer(
                {
                    "deployment_id": ref["deployment_id"],
                    "label": side_label(info, ref["base_url"], ref["model"]),
                    "model_version_id": info.get("model_version_id"),
                }
            ).data
        )

    @extend_schema(request=None, responses={200: EvalRunSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        """Ask the run to stop: no case starts after this; a run not yet started ends at once."""
        run = self.get_object()
        if run.finished:
            return Response({"detail": f"The run is already {run.state}."}, status=status.HTTP_409_CONFLICT)
        with transaction.atomic():
            EvalRun.objects.filter(pk=run.pk).update(cancel_requested=True)
            run.refresh_from_db()
            record_audit(
                actor=request.user, action=AuditAction.UPDATE, obj=run, after={"cancel_requested": True}
            )
        return Response(self.get_serializer(run).data)

    @extend_schema(request=None, responses={202: EvalRunSerializer})
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str | None = None) -> Response:
        """Run again what a run lacks: cases without a sample (a worker died, or it was cancelled or
        failed) and cases whose requests failed (their samples are removed first)."""
        run = self.get_object()
        if run.state == RunState.COMPLETED and run.error_count == 0:
            return Response(
                {"detail": "The run is complete: every case has a sample."}, status=status.HTTP_409_CONFLICT
            )
        with transaction.atomic():
            retried = run.samples.exclude(error="").delete()[0]
            changes: dict[str, Any] = {"cancel_requested": False, "error": ""}
            if run.finished:
                changes.update(state=RunState.PENDING, finished_at=None)
            EvalRun.objects.filter(pk=run.pk).update(**changes)
            record_audit(
                actor=request.user,
                action=AuditAction.UPDATE,
                obj=run,
                after={"resumed": True, "retried_errors": retried},
            )
            enqueue_evaluation(run.pk)
        run.refresh_from_db()
        return Response(self.get_serializer(run).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        parameters=[
            OpenApiParameter("differs", bool, description="only samples whose two outputs differ (or not)"),
            OpenApiParameter("flipped", str, enum=["any", "right_to_wrong", "wrong_to_right"]),
            OpenApiParameter("tag", str, description="only cases with this tag"),
            OpenApiParameter("errors", bool, description="only samples whose requests failed (or not)"),
            OpenApiParameter(
                "order", str, enum=["position", "worst_kl", "longest_divergence", "lowest_chrf"]
            ),
        ],
        responses={200: EvalSampleSerializer(many=True)},
    )
    @action(detail=True, methods=["get"], filter_backends=[])
    def samples(self, request: Request, pk: str | None = None) -> Response:
        """The run's samples, filtered (differs, flipped, tag, errors) and ordered (worst KL first ...)."""
        run = self.get_object()
        query = SampleQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        q = query.validated_data
        rows = run.samples.all()
        if q.get("differs") is not None:
            rows = rows.filter(exact_match=not q["differs"])
        flipped = q.get("flipped")
        if flipped == "any":
            rows = rows.exclude(flip="")
        elif flipped:
            rows = rows.filter(flip=flipped)
        if q.get("tag"):
            if connection.vendor == "postgresql":
                rows = rows.filter(tags__contains=[q["tag"]])
            else:  # SQLite (the zero-setup demo) has no JSON containment: filter the few tags here
                tagged = [pk for pk, tags in rows.values_list("pk", "tags") if q["tag"] in (tags or [])]
                rows = rows.filter(pk__in=tagged)
        if q.get("errors") is not None:
            rows = rows.exclude(error="") if q["errors"] else rows.filter(error="")
        order = q["order"]
        if order == "worst_kl":
            rows = rows.filter(mean_kl__isnull=False).order_by(F("mean_kl").desc(), "position")
        elif order == "longest_divergence":
            # Earliest parting point first: the outputs differ over the most tokens.
            rows = rows.filter(first_divergence__isnull=False).order_by("first_divergence", "position")
        elif order == "lowest_chrf":
            rows = rows.filter(~Q(chrf=None)).order_by("chrf", "position")
        else:
            rows = rows.order_by("position", "id")
        page = self.paginate_queryset(rows)
        serializer = EvalSampleSerializer(page if page is not None else rows, many=True)
        if page is not None:
            return self.get_paginated_response(serializer.data)
        return Response(serializer.data)
