"""Admin API for canary rollouts and shadow configs (docs/rollouts.md).

Thin: every change goes through routing.rollouts.services, whose PlanError becomes a JSON field error
and whose RolloutStateError a 409. Everyone signed in reads; admins write (console.permissions).
"""

from __future__ import annotations

from typing import Any

import django_filters
from django.db.models import Q, QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.base import AuditedModelViewSet, StrictModelSerializer, StrictSerializerMixin
from core.redis_client import publish_config_change
from models_registry.models import ModelAlias, ModelVersion
from routing.models import (
    ACTIVE_ROLLOUT_STATES,
    Rollout,
    RolloutDecision,
    RolloutState,
    ShadowConfig,
    StickyBy,
)
from routing.rollouts import services
from routing.rollouts.analysis import step_analyses
from routing.rollouts.plans import GATES, PlanError, validate_gates, validate_percent, validate_steps
from routing.serving import ready_deployments

GATES_SCHEMA = {
    "type": "object",
    "properties": {g.key: {"type": "number", "nullable": True, "description": g.label} for g in GATES},
    "additionalProperties": False,
}


@extend_schema_field(GATES_SCHEMA)
class GatesField(serializers.JSONField):
    pass


LIMITS_SCHEMA = {
    "failure_limit": {
        "type": "integer",
        "minimum": 0,
        "description": "Failed measurements allowed in a step; one more rolls back (default 0).",
    },
    "inconclusive_limit": {
        "type": "integer",
        "minimum": 0,
        "nullable": True,
        "description": "Inconclusive measurements allowed; one more pauses for a person (default none).",
    },
    "consecutive_error_limit": {
        "type": "integer",
        "minimum": 0,
        "description": "Measurements in a row that could not be made; one more rolls back (default 4).",
    },
    "min_samples": {
        "type": "integer",
        "minimum": 1,
        "description": "Statistical and shadow gates: Inconclusive below this many values (default 20).",
    },
}
ANALYSIS_SCHEMA = {
    "type": "object",
    "properties": {
        **LIMITS_SCHEMA,
        "metrics": {
            "type": "object",
            "description": "Per gate key: its own limits, and dry_run (measured and shown, never deciding).",
            "additionalProperties": {
                "type": "object",
                "properties": {**LIMITS_SCHEMA, "dry_run": {"type": "boolean"}},
                "additionalProperties": False,
            },
        },
    },
    "additionalProperties": False,
}


@extend_schema_field(ANALYSIS_SCHEMA)
class AnalysisField(serializers.JSONField):
    pass


@extend_schema_field(serializers.ListField(child=serializers.FloatField()))
class StepsField(serializers.JSONField):
    pass


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"


def field_error(exc: PlanError) -> ValidationError:
    return ValidationError({exc.field: [exc.message]})


class RolloutDecisionSerializer(serializers.ModelSerializer):
    actor_name = serializers.SerializerMethodField()

    class Meta:
        model = RolloutDecision
        fields = [
            "id",
            "created_at",
            "action",
            "from_share",
            "to_share",
            "reason",
            "numbers",
            "actor",
            "actor_name",
        ]
        read_only_fields = fields

    def get_actor_name(self, obj: RolloutDecision) -> str:
        return obj.actor.get_username() if obj.actor else "gate task"


class VersionShareSerializer(serializers.Serializer):
    """One version's part of a rollout's plan."""

    version_id = serializers.IntegerField()
    version_label = serializers.CharField()
    role = serializers.ChoiceField(choices=["active", "candidate", "shadow"])
    share = serializers.FloatField(help_text="Percent of the alias's requests the rollout gives it.")
    ready_deployments = serializers.IntegerField()


class MetricCountsSerializer(serializers.Serializer):
    measurements = serializers.IntegerField()
    successful = serializers.IntegerField()
    failed = serializers.IntegerField()
    inconclusive = serializers.IntegerField()
    # DRF's metaclass moves declared fields out of the class, so Serializer.errors is untouched.
    errors = serializers.IntegerField()  # type: ignore[assignment]
    consecutive_errors = serializers.IntegerField()


class StepMetricSerializer(serializers.Serializer):
    """One gate's measurement in a step's decision: outcome, value against threshold, counts and limits."""

    key = serializers.CharField()
    title = serializers.CharField()
    bound = serializers.ChoiceField(choices=["max", "min"])
    outcome = serializers.CharField(allow_blank=True, help_text="Successful, Failed, Inconclusive or Error.")
    value = serializers.FloatField(allow_null=True)
    threshold = serializers.FloatField(allow_null=True)
    detail = serializers.CharField(allow_blank=True)
    dry_run = serializers.BooleanField()
    counts = MetricCountsSerializer()
    failure_limit = serializers.IntegerField()
    inconclusive_limit = serializers.IntegerField(allow_null=True)
    consecutive_error_limit = serializers.IntegerField()


class StepDecisionSerializer(serializers.Serializer):
    action = serializers.CharField()
    created_at = serializers.DateTimeField()
    reason = serializers.CharField(allow_blank=True)
    actor_name = serializers.CharField()


class RolloutStepSerializer(serializers.Serializer):
    """One step of the plan with its latest decision and the numbers that decision was made on."""

    index = serializers.IntegerField()
    share = serializers.FloatField()
    approval = serializers.BooleanField(help_text="The step waits for an admin's approval once it passes.")
    status = serializers.CharField(help_text="done, current, stopped (rolled back at it) or pending.")
    decision = StepDecisionSerializer(allow_null=True)
    candidate_requests = serializers.IntegerField(allow_null=True)
    baseline_requests = serializers.IntegerField(allow_null=True)
    metrics = StepMetricSerializer(many=True)


def rollout_split(rollout: Rollout) -> list[dict[str, Any]]:
    """The rollout's plan: baseline and candidate with the share it gives each (0 after a rollback, 100
    once promoted). What serves the alias now, live, is routing.serving's answer (`/api/routing/serving/`)."""
    name = rollout.alias.name
    ready = ready_deployments([name])
    cand = rollout.share if rollout.state != RolloutState.ROLLED_BACK else 0.0
    if rollout.state == RolloutState.PROMOTED:
        cand = 100.0
    return [
        {
            "version_id": rollout.baseline_version_id,
            "version_label": str(rollout.baseline_version),
            "role": "active",
            "share": 100.0 - cand,
            "ready_deployments": ready.get((name, rollout.baseline_version_id), 0),
        },
        {
            "version_id": rollout.candidate_version_id,
            "version_label": str(rollout.candidate_version),
            "role": "candidate",
            "share": cand,
            "ready_deployments": ready.get((name, rollout.candidate_version_id), 0),
        },
    ]


class RolloutSerializer(serializers.ModelSerializer):
    alias_name = serializers.CharField(source="alias.name", read_only=True)
    baseline_label = serializers.CharField(source="baseline_version.__str__", read_only=True)
    candidate_label = serializers.CharField(source="candidate_version.__str__", read_only=True)
    steps = StepsField(read_only=True)
    gates = GatesField(read_only=True)
    analysis = AnalysisField(read_only=True)
    approval_steps = StepsField(read_only=True)
    active = serializers.BooleanField(read_only=True)
    created_by_name = serializers.SerializerMethodField()
    split = serializers.SerializerMethodField()

    class Meta:
        model = Rollout
        fields = [
            "id",
            "alias",
            "alias_name",
            "baseline_version",
            "baseline_label",
            "candidate_version",
            "candidate_label",
            "steps",
            "step_index",
            "share",
            "state",
            "active",
            "sticky_by",
            "min_step_seconds",
            "min_step_requests",
            "gates",
            "analysis",
            "approval_steps",
            "require_signoff",
            "step_started_at",
            "reason",
            "created_by",
            "created_by_name",
            "created_at",
            "updated_at",
            "finished_at",
            "split",
        ]
        read_only_fields = fields

    def get_created_by_name(self, obj: Rollout) -> str:
        return obj.created_by.get_username() if obj.created_by else ""

    @extend_schema_field(VersionShareSerializer(many=True))
    def get_split(self, obj: Rollout) -> list[dict[str, Any]]:
        return rollout_split(obj)


class RolloutDetailSerializer(RolloutSerializer):
    decisions = RolloutDecisionSerializer(many=True, read_only=True)
    steps_analysis = serializers.SerializerMethodField()

    class Meta(RolloutSerializer.Meta):
        fields = [*RolloutSerializer.Meta.fields, "decisions", "steps_analysis"]
        read_only_fields = fields

    @extend_schema_field(RolloutStepSerializer(many=True))
    def get_steps_analysis(self, obj: Rollout) -> list[dict[str, Any]]:
        return step_analyses(obj, list(obj.decisions.all()))


class RolloutCreateSerializer(StrictSerializerMixin, serializers.Serializer):
    alias = serializers.PrimaryKeyRelatedField(queryset=ModelAlias.objects.select_related("active_version"))
    candidate_version = serializers.PrimaryKeyRelatedField(
        queryset=ModelVersion.objects.select_related("model")
    )
    steps = StepsField(help_text="Rising percentages ending at 100, e.g. [1, 5, 25, 50, 100].")
    gates = GatesField(required=False, default=dict)
    min_step_seconds = serializers.IntegerField(min_value=0, max_value=7 * 86400, default=300)
    min_step_requests = serializers.IntegerField(min_value=1, max_value=10_000_000, default=100)
    require_signoff = serializers.BooleanField(default=False)
    sticky_by = serializers.ChoiceField(choices=StickyBy.choices, default=StickyBy.SESSION)
    analysis = AnalysisField(
        required=False,
        default=dict,
        help_text="Limits (failure, inconclusive, consecutive errors, minimum sample) for every gate and per "
        "gate, and dry-run gates; docs/rollouts.md, Analysis.",
    )
    approval_steps = StepsField(
        required=False,
        default=list,  # type: ignore[arg-type]  # a JSON list; the stubs type JSONField's default as a mapping
        help_text="Steps (percentages below 100) after whose passed analysis an admin approves, e.g. [25].",
    )

    def validate_steps(self, value: Any) -> list[float]:
        try:
            return validate_steps(value)
        except PlanError as exc:
            raise serializers.ValidationError(exc.message) from None

    def validate_gates(self, value: Any) -> dict[str, float]:
        try:
            return validate_gates(value)
        except PlanError as exc:
            raise serializers.ValidationError(exc.message) from None


class RolloutActionSerializer(StrictSerializerMixin, serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")


class GateInfoSerializer(serializers.Serializer):
    key = serializers.CharField()
    title = serializers.CharField()
    bound = serializers.ChoiceField(choices=["max", "min"])
    unit = serializers.CharField(allow_blank=True)
    threshold = serializers.FloatField()


class GatePointSerializer(serializers.Serializer):
    t = serializers.DateTimeField()
    kind = serializers.ChoiceField(choices=["tick", "decision"], help_text="An evaluation, or a decision.")
    step = serializers.IntegerField()
    share = serializers.FloatField()
    verdict = serializers.CharField()
    values = serializers.DictField(child=serializers.FloatField(allow_null=True))
    details = serializers.DictField(
        child=serializers.CharField(),
        required=False,
        help_text="Statistical gates: the judgement (Successful/Failed/Inconclusive, shift, interval).",
    )
    candidate_requests = serializers.IntegerField(allow_null=True)
    baseline_requests = serializers.IntegerField(allow_null=True)


class GateSeriesSerializer(serializers.Serializer):
    gates = GateInfoSerializer(many=True)
    points = GatePointSerializer(many=True)


class RolloutFilter(django_filters.FilterSet):
    active = django_filters.BooleanFilter(method="filter_active")

    class Meta:
        model = Rollout
        fields = ["alias", "state", "candidate_version"]

    def filter_active(self, queryset: QuerySet[Rollout], name: str, value: bool) -> QuerySet[Rollout]:
        q = Q(state__in=ACTIVE_ROLLOUT_STATES)
        return queryset.filter(q) if value else queryset.exclude(q)


class RolloutViewSet(viewsets.ReadOnlyModelViewSet):
    """Canaries: list, start, and per rollout its decisions, split, gate values and actions."""

    filterset_class = RolloutFilter
    search_fields = ["alias__name", "reason"]
    ordering_fields = ["created_at"]

    def get_queryset(self) -> QuerySet[Rollout]:
        qs = Rollout.objects.select_related(
            "alias", "baseline_version__model", "candidate_version__model", "created_by"
        )
        if self.action == "retrieve":
            qs = qs.prefetch_related("decisions__actor")
        return qs

    def get_serializer_class(self) -> type[serializers.BaseSerializer[Any]]:
        return RolloutDetailSerializer if self.action != "list" else RolloutSerializer

    def _detail(self, rollout: Rollout) -> Response:
        fresh = self.get_queryset().prefetch_related("decisions__actor").get(pk=rollout.pk)
        return Response(RolloutDetailSerializer(fresh).data)

    @extend_schema(request=RolloutCreateSerializer, responses={201: RolloutDetailSerializer})
    def create(self, request: Request) -> Response:
        """Start a canary at its first step; refused with a field error (steps, gates, candidate, alias)."""
        body = RolloutCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        try:
            rollout = services.start_rollout(
                data.pop("alias"),
                data.pop("candidate_version"),
                data.pop("steps"),
                actor=request.user,
                **data,
            )
        except PlanError as exc:
            raise field_error(exc) from None
        response = self._detail(rollout)
        response.status_code = status.HTTP_201_CREATED
        return response

    def _act(self, request: Request, fn: Any) -> Response:
        rollout = self.get_object()
        body = RolloutActionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            updated = fn(rollout, actor=request.user, reason=body.validated_data["reason"])
        except PlanError as exc:
            raise field_error(exc) from None
        except services.RolloutStateError as exc:
            raise Conflict(str(exc)) from None
        return self._detail(updated)

    @extend_schema(request=RolloutActionSerializer, responses={200: RolloutDetailSerializer})
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, pk: str | None = None) -> Response:
        """Hold the share where it is; the gate task leaves it alone (unless its candidate dies)."""
        return self._act(request, services.pause)

    @extend_schema(request=RolloutActionSerializer, responses={200: RolloutDetailSerializer})
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str | None = None) -> Response:
        """Hand a paused (or holding) rollout back to the gate task."""
        return self._act(request, services.resume)

    @extend_schema(request=RolloutActionSerializer, responses={200: RolloutDetailSerializer})
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str | None = None) -> Response:
        """Approve a step awaiting approval: on to the next step, or from the last one below 100 promote."""
        return self._act(request, services.approve)

    @extend_schema(request=RolloutActionSerializer, responses={200: RolloutDetailSerializer})
    @action(detail=True, methods=["post"])
    def promote(self, request: Request, pk: str | None = None) -> Response:
        """Make the candidate the alias's active version now (needs the sign-off when the plan says so)."""
        return self._act(request, services.promote)

    @extend_schema(request=RolloutActionSerializer, responses={200: RolloutDetailSerializer})
    @action(detail=True, methods=["post"])
    def rollback(self, request: Request, pk: str | None = None) -> Response:
        """Send the candidate's share to 0 at once."""
        return self._act(request, services.rollback)

    @extend_schema(responses={200: GateSeriesSerializer})
    @action(detail=True, methods=["get"])
    def gates(self, request: Request, pk: str | None = None) -> Response:
        """Gate values over time (each gate-task evaluation, and each decision) with their thresholds."""
        rollout = self.get_object()
        info = [
            {
                "key": g.key,
                "title": g.label,
                "bound": g.bound,
                "unit": g.unit,
                "threshold": rollout.gates[g.key],
            }
            for g in GATES
            if rollout.gates.get(g.key) is not None
        ]
        points: list[dict[str, Any]] = [{**s, "kind": "tick"} for s in services.gate_samples(rollout.pk)]
        for d in rollout.decisions.all():
            gates = (d.numbers or {}).get("gates") or {}
            step = (d.numbers or {}).get("step") or {}
            points.append(
                {
                    "t": d.created_at,
                    "kind": "decision",
                    "step": step.get("index", 0),
                    "share": d.to_share,
                    "verdict": d.action,
                    "values": {k: v.get("value") for k, v in gates.items()},
                    "details": {k: v["detail"] for k, v in gates.items() if v.get("outcome")},
                    "candidate_requests": ((d.numbers or {}).get("candidate") or {}).get("requests"),
                    "baseline_requests": ((d.numbers or {}).get("baseline") or {}).get("requests"),
                }
            )
        series = GateSeriesSerializer({"gates": info, "points": points}).data
        series["points"] = sorted(series["points"], key=lambda p: p["t"])
        return Response(series)


class ShadowConfigSerializer(StrictModelSerializer):
    alias_name = serializers.CharField(source="alias.name", read_only=True)
    candidate_label = serializers.CharField(source="candidate_version.__str__", read_only=True)
    # A plain number so an out-of-range value gets the one message below, not two validators' wording.
    percent = serializers.FloatField(help_text="Percent of the alias's live requests mirrored, 0 to 100.")

    class Meta:
        model = ShadowConfig
        fields = [
            "id",
            "alias",
            "alias_name",
            "candidate_version",
            "candidate_label",
            "percent",
            "enabled",
            "max_inflight",
            "timeout_s",
            "created_by",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["id", "alias_name", "candidate_label", "created_by", "created_at", "updated_at"]

    def validate_percent(self, value: float) -> float:
        try:
            return validate_percent(value)
        except PlanError as exc:
            raise serializers.ValidationError(exc.message) from None

    def validate_timeout_s(self, value: float) -> float:
        if value <= 0:
            raise serializers.ValidationError("Must be greater than 0 seconds.")
        return value

    def validate(self, attrs: Any) -> Any:
        attrs = super().validate(attrs)
        alias = attrs.get("alias", getattr(self.instance, "alias", None))
        candidate = attrs.get("candidate_version", getattr(self.instance, "candidate_version", None))
        enabled = attrs.get("enabled", getattr(self.instance, "enabled", True))
        changed = self.instance is None or any(k in attrs for k in ("alias", "candidate_version", "enabled"))
        if alias is not None and candidate is not None and enabled and changed:
            try:
                services.check_candidate(alias, candidate)
            except PlanError as exc:
                raise field_error(exc) from None
        return attrs


class ShadowConfigViewSet(AuditedModelViewSet):
    """Shadow traffic per alias: a percentage of live requests mirrored to a candidate version."""

    serializer_class = ShadowConfigSerializer
    filterset_fields = ["alias", "candidate_version", "enabled"]
    search_fields = ["alias__name"]

    def get_queryset(self) -> QuerySet[ShadowConfig]:
        return ShadowConfig.objects.select_related("alias", "candidate_version__model")

    def perform_create(self, serializer: Any) -> None:
        serializer.validated_data["created_by"] = self.request.user
        super().perform_create(serializer)
        publish_config_change("shadow_config", alias=serializer.instance.alias.name)

    def perform_update(self, serializer: Any) -> None:
        super().perform_update(serializer)
        publish_config_change("shadow_config", alias=serializer.instance.alias.name)

    def perform_destroy(self, instance: Any) -> None:
        name = instance.alias.name
        super().perform_destroy(instance)
        publish_config_change("shadow_config", alias=name)
