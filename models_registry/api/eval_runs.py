"""The evaluation runs API: start a run, follow it, list its samples, cancel or resume it; review it
(a mark per sample), sign it off (a verdict) and export its samples.

Evaluators and admins start, cancel, review and sign runs (`evaluator_writable`); viewers read. A side
is a fleet deployment (by id, resolved through models_registry.evaluation.endpoints) or the base URL and
served name of a keyless OpenAI-compatible engine. Without a reference, the candidate deployment's
lineage parent is used, wherever it is deployed.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Prefetch, Q, QuerySet
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import mixins, renderers, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.base import StrictSerializerMixin
from core.audit import record_audit
from core.choices import AuditAction
from models_registry.evaluation import endpoints
from models_registry.evaluation.models import (
    EvalReview,
    EvalRun,
    EvalSample,
    EvalSuiteVersion,
    EvalVerdict,
    RunState,
    SampleMark,
    VerdictDecision,
    greedy_params,
)
from models_registry.evaluation.review import (
    ReviewRefused,
    clear_mark,
    csv_lines,
    current_verdict,
    export_rows,
    jsonl_lines,
    mark_count_annotations,
    mark_counts,
    mark_sample,
    sign_run,
)
from models_registry.evaluation.runner import run_group
from models_registry.models import ModelVersion
from models_registry.tasks import enqueue_evaluation

SIDES = ("reference", "candidate")
SAMPLE_ORDERS = ("position", "worst_kl", "longest_divergence", "latest_divergence", "lowest_chrf")
MARK_FILTERS = ("any", "none", *SampleMark.values)


class ReviewRefusedConflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The run's state does not allow this."
    default_code = "review_refused"


class EvalVerdictSerializer(serializers.ModelSerializer):
    """A signed verdict; `current` is false once a later verdict superseded it."""

    run_name = serializers.SerializerMethodField()
    suite_name = serializers.CharField(source="run.suite_version.suite.name", read_only=True)
    suite_version_number = serializers.IntegerField(source="run.suite_version.number", read_only=True)
    candidate_version_label = serializers.SerializerMethodField()
    current = serializers.BooleanField(read_only=True)

    class Meta:
        model = EvalVerdict
        fields = [
            "id",
            "run",
            "run_name",
            "suite_name",
            "suite_version_number",
            "decision",
            "comment",
            "candidate_version",
            "candidate_version_label",
            "signed_by_name",
            "signed_at",
            "superseded_at",
            "current",
        ]
        read_only_fields = fields

    def get_run_name(self, verdict: EvalVerdict) -> str:
        return str(verdict.run)

    def get_candidate_version_label(self, verdict: EvalVerdict) -> str | None:
        return str(verdict.candidate_version) if verdict.candidate_version_id else None


class MarkCountsSerializer(serializers.Serializer):
    """How many scored samples carry each mark; `unmarked` counts the rest."""

    same = serializers.IntegerField()
    acceptable = serializers.IntegerField()
    regression = serializers.IntegerField()
    unmarked = serializers.IntegerField()


# -- the shapes of the other JSON columns, for the schema (and so the console's generated types) ------------


class SideInfoSerializer(serializers.Serializer):
    """What stood behind a side when the run was created (a deployment's facts; a base URL's alone)."""

    base_url = serializers.CharField(required=False)
    deployment = serializers.CharField(required=False)
    host = serializers.CharField(required=False)
    engine = serializers.CharField(required=False)
    model_version_id = serializers.IntegerField(required=False)
    model = serializers.CharField(required=False)
    revision = serializers.CharField(required=False)
    manifest_digest = serializers.CharField(required=False)
    quantization_id = serializers.IntegerField(required=False, allow_null=True)
    launch_argv = serializers.ListField(child=serializers.CharField(), required=False)
    extra_args = serializers.ListField(child=serializers.CharField(), required=False)
    max_model_len = serializers.IntegerField(required=False, allow_null=True)
    greedy = serializers.DictField(required=False, help_text="The sampling fields a greedy generation sent.")


@extend_schema_field(SideInfoSerializer)
class SideInfoField(serializers.JSONField):
    pass


@extend_schema_field({"type": "array", "items": {"type": "string"}})
class StringListField(serializers.JSONField):
    pass


@extend_schema_field({"type": "array", "items": {"type": "number", "format": "double"}})
class NumberListField(serializers.JSONField):
    pass


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
    mcnemar_p = serializers.FloatField(
        required=False, help_text="Exact McNemar p-value of the flips (1.0: no flips)."
    )
    recovery = serializers.FloatField(
        required=False, allow_null=True, help_text="Candidate accuracy as % of the reference's."
    )


class KLQuantilesSerializer(serializers.Serializer):
    p50 = serializers.FloatField()
    p90 = serializers.FloatField()
    p99 = serializers.FloatField()
    p99_9 = serializers.FloatField()
    max = serializers.FloatField()


def _interval(help_text: str) -> serializers.ListField:
    return serializers.ListField(
        child=serializers.FloatField(), required=False, allow_null=True, help_text=help_text
    )


class DistributionSummarySerializer(serializers.Serializer):
    samples = serializers.IntegerField()
    positions = serializers.IntegerField()
    top1_agreement = serializers.FloatField(help_text="Share of positions with the same most likely token.")
    mean_kl = serializers.FloatField()
    kl_ci = _interval("[low, high] bootstrap interval of the mean KL (samples resampled).")
    kl_quantiles = KLQuantilesSerializer(required=False, allow_null=True)
    method = serializers.CharField(
        required=False,
        help_text="full_vocabulary (both sides listed their whole distribution: the KL is exact) or top_k.",
    )
    keys = serializers.CharField(
        required=False,
        allow_null=True,
        help_text="How both sides' listings were matched: token_ids (by token id: exact even where two ids "
        "share a text), token_text, or mixed; null for runs made before it was recorded.",
    )
    k = serializers.IntegerField(
        required=False, allow_null=True, help_text="Tokens listed per position (-1: the whole vocabulary)."
    )
    tail_mass_max = serializers.FloatField(
        required=False, allow_null=True, help_text="Largest probability a listing left out at one position."
    )
    dp_positions = serializers.IntegerField(required=False)
    mean_dp = serializers.FloatField(
        required=False, allow_null=True, help_text="Mean change in the reference token's probability."
    )
    rms_dp = serializers.FloatField(required=False, allow_null=True)
    perplexity_ratio = serializers.FloatField(
        required=False,
        allow_null=True,
        help_text="Candidate / reference perplexity on the reference's text.",
    )


class TagSummarySerializer(serializers.Serializer):
    samples = serializers.IntegerField()
    exact_match_rate = serializers.FloatField()
    chrf = serializers.FloatField(allow_null=True)
    mean_kl = serializers.FloatField(allow_null=True)
    reference_accuracy = serializers.FloatField(allow_null=True)
    candidate_accuracy = serializers.FloatField(allow_null=True)
    flips = serializers.IntegerField(allow_null=True)
    recovery = serializers.FloatField(allow_null=True)


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
    chrf_ci = _interval("[low, high] bootstrap interval of the mean chrF.")
    length_difference = serializers.FloatField(required=False, allow_null=True)
    flips = FlipTableSerializer(required=False, allow_null=True)
    by_tag = serializers.DictField(
        child=TagSummarySerializer(), required=False, help_text="The headline figures per case tag."
    )
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


class GreedySerializer(serializers.Serializer):
    reference = serializers.DictField(help_text="The sampling fields every reference generation sends.")
    candidate = serializers.DictField(help_text="The sampling fields every candidate generation sends.")


class SamplingSerializer(serializers.Serializer):
    """How the run decodes: greedy, as each side's engine kind means it (docs/evaluations.md)."""

    temperature = serializers.FloatField()
    seed = serializers.IntegerField()
    max_tokens = serializers.IntegerField()
    top_logprobs = serializers.IntegerField()
    greedy = GreedySerializer()


class EvalRunSerializer(serializers.ModelSerializer):
    reference_info = SideInfoField(read_only=True)
    candidate_info = SideInfoField(read_only=True)
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
    marks = serializers.SerializerMethodField()
    verdict = serializers.SerializerMethodField()
    scored_count = serializers.SerializerMethodField(
        help_text="Samples both sides answered (done_count - error_count): what a verdict rests on."
    )
    min_scored_to_accept = serializers.SerializerMethodField(
        help_text="How many scored samples accepting the run needs (EVAL_MIN_SCORED_SAMPLES)."
    )

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
            "scored_count",
            "min_scored_to_accept",
            "attempts",
            "summary",
            "teacher_forcing_note",
            "error",
            "live_group",
            "reference_label",
            "candidate_label",
            "created_by_name",
            "marks",
            "verdict",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_scored_count(self, run: EvalRun) -> int:
        return max(0, run.done_count - run.error_count)

    def get_min_scored_to_accept(self, run: EvalRun) -> int:
        return int(settings.EVAL_MIN_SCORED_SAMPLES)

    @extend_schema_field(SamplingSerializer)
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

    @extend_schema_field(MarkCountsSerializer)
    def get_marks(self, run: EvalRun) -> dict[str, int]:
        return mark_counts(run)

    @extend_schema_field(EvalVerdictSerializer(allow_null=True))
    def get_verdict(self, run: EvalRun) -> dict[str, Any] | None:
        """The verdict in force (null until someone signs the run)."""
        verdict = current_verdict(run)
        return dict(EvalVerdictSerializer(verdict).data) if verdict is not None else None


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
            problem = endpoints.not_ready(side, ep.info.get("deployment"), ep.state)
            if problem:
                raise serializers.ValidationError({f"{side}_deployment": [problem]})
            return {"deployment_id": dep, "base_url": ep.base_url, "model": ep.model, "info": ep.info}
        if url or model:
            errors = {}
            if not url:
                errors[f"{side}_base_url"] = ["Required with a model name."]
            if not model:
                errors[f"{side}_model"] = ["Required with a base URL (the engine's served model name)."]
            if errors:
                raise serializers.ValidationError(errors)
            probe = endpoints.probe_base_url(url, model, settings.EVAL_READY_PROBE_SECONDS)
            if probe.problem:
                raise serializers.ValidationError({f"{side}_base_url": [probe.problem]})
            info = {"base_url": url, "engine": probe.engine}
            return {"deployment_id": None, "base_url": url, "model": model, "info": info}
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
        for side in (reference, candidate):
            # What greedy means for this engine, recorded with the run (EvalRun.greedy).
            side["info"] = {**side["info"], "greedy": greedy_params(side["info"].get("engine"))}
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


class SampleReviewSerializer(serializers.ModelSerializer):
    class Meta:
        model = EvalReview
        fields = ["mark", "comment", "marked_by_name", "marked_at"]
        read_only_fields = fields


class EvalSampleSerializer(serializers.ModelSerializer):
    # The case as it was sent (the suite version is frozen, so it is what the run measured).
    prompt = serializers.CharField(source="case.prompt", read_only=True)
    messages = serializers.JSONField(source="case.messages", read_only=True, allow_null=True)
    expected = serializers.CharField(source="case.expected", read_only=True, allow_null=True)
    match_rule = serializers.CharField(source="case.match_rule", read_only=True)
    review = SampleReviewSerializer(read_only=True, allow_null=True)
    tags = StringListField(read_only=True)
    reference_tokens = StringListField(read_only=True)
    candidate_tokens = StringListField(read_only=True)
    reference_token_logprobs = NumberListField(read_only=True)
    candidate_token_logprobs = NumberListField(read_only=True)
    position_kl = NumberListField(read_only=True)

    class Meta:
        model = EvalSample
        fields = [
            "id",
            "run",
            "case",
            "case_key",
            "position",
            "tags",
            "prompt",
            "messages",
            "expected",
            "match_rule",
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
            "review",
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
    marked = serializers.ChoiceField(required=False, choices=MARK_FILTERS, allow_blank=True)
    order = serializers.ChoiceField(required=False, choices=SAMPLE_ORDERS, default="position")
    limit = serializers.IntegerField(required=False, min_value=1, max_value=500)
    offset = serializers.IntegerField(required=False, min_value=0)


class ExportQuerySerializer(SampleQuerySerializer):
    """The sample filters, for an export of what the sample list shows (no paging: every match)."""

    limit = None  # type: ignore[assignment]
    offset = None  # type: ignore[assignment]


def filter_samples(rows: QuerySet[EvalSample], q: dict[str, Any]) -> QuerySet[EvalSample]:
    """The sample list's filters and order (SampleQuerySerializer's validated values)."""
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
    marked = q.get("marked")
    if marked == "any":
        rows = rows.filter(review__isnull=False)
    elif marked == "none":
        rows = rows.filter(review__isnull=True)
    elif marked:
        rows = rows.filter(review__mark=marked)
    order = q.get("order") or "position"
    if order == "worst_kl":
        return rows.filter(mean_kl__isnull=False).order_by(F("mean_kl").desc(), "position")
    if order == "longest_divergence":
        # Earliest parting point first: the outputs differ over the most tokens.
        return rows.filter(first_divergence__isnull=False).order_by("first_divergence", "position")
    if order == "latest_divergence":
        # Latest parting point first: long agreement, then a late change (often the final answer).
        return rows.filter(first_divergence__isnull=False).order_by(F("first_divergence").desc(), "position")
    if order == "lowest_chrf":
        return rows.filter(~Q(chrf=None)).order_by("chrf", "position")
    return rows.order_by("position", "id")


class MarkSerializer(StrictSerializerMixin, serializers.Serializer):
    mark = serializers.ChoiceField(choices=SampleMark.choices)
    comment = serializers.CharField(required=False, allow_blank=True, default="", max_length=5000)


class SignSerializer(StrictSerializerMixin, serializers.Serializer):
    decision = serializers.ChoiceField(choices=VerdictDecision.choices)
    comment = serializers.CharField(required=False, allow_blank=True, default="", max_length=5000)

    def validate(self, attrs: Any) -> Any:
        if attrs["decision"] == VerdictDecision.REJECT and not attrs["comment"].strip():
            raise serializers.ValidationError({"comment": ["Say why the run is rejected."]})
        return attrs


SAMPLE_FILTER_PARAMETERS = [
    OpenApiParameter("differs", bool, description="only samples whose two outputs differ (or not)"),
    OpenApiParameter("flipped", str, enum=["any", "right_to_wrong", "wrong_to_right"]),
    OpenApiParameter("tag", str, description="only cases with this tag"),
    OpenApiParameter("errors", bool, description="only samples whose requests failed (or not)"),
    OpenApiParameter(
        "marked", str, enum=list(MARK_FILTERS), description="by review mark: any, none, or one mark"
    ),
    OpenApiParameter("order", str, enum=list(SAMPLE_ORDERS)),
]


class DownloadNegotiation(BaseContentNegotiation):
    """For a download: whatever the Accept header asks (text/csv, application/x-ndjson ...), the body is
    the stream the view returns, and an error is JSON (DRF's shape), never a 406."""

    def select_parser(self, request: Request, parsers: Any) -> Any:
        return parsers[0] if parsers else None

    def select_renderer(self, request: Request, renderers: Any, format_suffix: str | None = None) -> Any:
        return renderers[0], renderers[0].media_type


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
        current = EvalVerdict.objects.filter(superseded_at__isnull=True).select_related(
            "run__suite_version__suite", "candidate_version__model"
        )
        return (
            EvalRun.objects.select_related("suite_version__suite", "created_by")
            .annotate(**mark_count_annotations())
            .prefetch_related(Prefetch("verdicts", queryset=current, to_attr="current_verdicts"))
        )

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, ReviewRefused):
            exc = ReviewRefusedConflict(str(exc))
        return super().handle_exception(exc)

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
        if current_verdict(run) is not None:
            # A verdict is about the samples as they were signed; a resume would change them under it.
            return Response(
                {"detail": "The run is signed off; start a new run instead of resuming it."},
                status=status.HTTP_409_CONFLICT,
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

    def _samples(self, run: EvalRun) -> QuerySet[EvalSample]:
        return run.samples.select_related("case", "review")

    @extend_schema(parameters=SAMPLE_FILTER_PARAMETERS, responses={200: EvalSampleSerializer(many=True)})
    @action(detail=True, methods=["get"], filter_backends=[])
    def samples(self, request: Request, pk: str | None = None) -> Response:
        """The run's samples, filtered (differs, flipped, tag, errors, marked) and ordered (worst KL
        first ...), each with its review mark."""
        run = self.get_object()
        query = SampleQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        rows = filter_samples(self._samples(run), query.validated_data)
        page = self.paginate_queryset(rows)
        serializer = EvalSampleSerializer(page if page is not None else rows, many=True)
        if page is not None:
            return self.get_paginated_response(serializer.data)
        return Response(serializer.data)

    @extend_schema(
        methods=["POST"],
        parameters=[OpenApiParameter("sample_id", int, OpenApiParameter.PATH)],
        request=MarkSerializer,
        responses={200: EvalSampleSerializer},
    )
    @extend_schema(
        methods=["DELETE"],
        parameters=[OpenApiParameter("sample_id", int, OpenApiParameter.PATH)],
        request=None,
        responses={200: EvalSampleSerializer},
    )
    @action(
        detail=True,
        methods=["post", "delete"],
        url_path=r"samples/(?P<sample_id>[0-9]+)/mark",
        url_name="sample-mark",
        filter_backends=[],
    )
    def mark(self, request: Request, pk: str | None = None, sample_id: str | None = None) -> Response:
        """Mark one sample same / acceptable / regression with a comment (replacing its mark), or DELETE
        the mark. Answers the sample with its review."""
        run = self.get_object()
        sample = self._samples(run).filter(pk=int(sample_id or 0)).first()
        if sample is None:
            return Response({"detail": "No such sample in this run."}, status=status.HTTP_404_NOT_FOUND)
        if request.method == "DELETE":
            clear_mark(sample, actor=request.user)
        else:
            body = MarkSerializer(data=request.data)
            body.is_valid(raise_exception=True)
            mark_sample(
                sample, body.validated_data["mark"], body.validated_data["comment"], actor=request.user
            )
        return Response(EvalSampleSerializer(self._samples(run).get(pk=sample.pk)).data)

    @extend_schema(request=SignSerializer, responses={201: EvalVerdictSerializer})
    @action(detail=True, methods=["post"])
    def sign(self, request: Request, pk: str | None = None) -> Response:
        """Sign the run off: accept or reject, with a comment (required to reject). Supersedes the
        current verdict, which stays in the history. 409 until the run has finished; only a completed
        run can be accepted."""
        run = self.get_object()
        body = SignSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        verdict = sign_run(
            run, body.validated_data["decision"], body.validated_data["comment"], actor=request.user
        )
        verdict = EvalVerdict.objects.select_related(
            "run__suite_version__suite", "candidate_version__model"
        ).get(pk=verdict.pk)
        return Response(EvalVerdictSerializer(verdict).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: EvalVerdictSerializer(many=True)})
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def verdicts(self, request: Request, pk: str | None = None) -> Response:
        """Every verdict signed on the run, newest first (the first is current unless superseded)."""
        run = self.get_object()
        rows = run.verdicts.select_related("run__suite_version__suite", "candidate_version__model")
        return Response(EvalVerdictSerializer(rows, many=True).data)

    @extend_schema(
        parameters=[
            OpenApiParameter("kind", str, OpenApiParameter.PATH, enum=["csv", "jsonl"]),
            *SAMPLE_FILTER_PARAMETERS,
        ],
        responses={(200, "text/csv"): OpenApiTypes.STR, (200, "application/x-ndjson"): OpenApiTypes.STR},
    )
    @action(
        detail=True,
        methods=["get"],
        url_path=r"export/(?P<kind>csv|jsonl)",
        url_name="export",
        filter_backends=[],
        renderer_classes=[renderers.JSONRenderer],
        content_negotiation_class=DownloadNegotiation,
    )
    def export(self, request: Request, pk: str | None = None, kind: str = "csv") -> StreamingHttpResponse:
        """The run's samples (the list's filters apply) with every per-sample metric and the review
        marks, streamed as CSV or JSONL (docs/evaluations.md, "Export")."""
        run = self.get_object()
        query = ExportQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        rows = filter_samples(self._samples(run), query.validated_data)
        records = export_rows(rows.iterator(chunk_size=200))
        if kind == "jsonl":
            lines, content_type = jsonl_lines(records), "application/x-ndjson; charset=utf-8"
        else:
            lines, content_type = csv_lines(records), "text/csv; charset=utf-8"
        response = StreamingHttpResponse(lines, content_type=content_type)
        response["Content-Disposition"] = f'attachment; filename="eval-run-{run.pk}-samples.{kind}"'
        return response
