"""Serializers for route pools, policies and the request log."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.api.base import StrictModelSerializer
from models_registry.models import ModelAlias
from nodes.choices import SLEEP_LEVELS
from routing.api.request_log import LogNames
from routing.models import RequestLog, RoutePolicy, RoutePool
from routing.proxy.config import parse_rule
from routing.proxy.requestlog import COLUMNS as REQUEST_LOG_COLUMNS
from routing.scaling.sleep import pool_sleep_problem

WEIGHT_NAMES = {"load", "kv", "prefix"}

# One name or several: a rule's alias, task and tenant conditions take either.
NAMES_SCHEMA = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}


@extend_schema_field(NAMES_SCHEMA)
class NamesField(serializers.JSONField):
    pass


class RuleMatchSerializer(serializers.Serializer):
    """A rule's conditions, all of which must hold; an absent key is no condition (see parse_rule)."""

    alias = NamesField(required=False)
    min_prompt_tokens = serializers.IntegerField(required=False, min_value=0)
    max_prompt_tokens = serializers.IntegerField(required=False, min_value=0)
    task = NamesField(required=False)
    tenant = NamesField(required=False)
    priority = serializers.ChoiceField(choices=["interactive", "batch"], required=False)


class RouteSpillSerializer(serializers.Serializer):
    """Overflow of a rule's requests onto another pool while it has headroom (routing.proxy.spill)."""

    pool = serializers.CharField(help_text="The pool the rule's requests may spill onto.")
    max_inflight = serializers.IntegerField(
        required=False, min_value=1, help_text="Spill only to an endpoint with fewer requests in flight."
    )
    max_kv_used = serializers.FloatField(
        required=False,
        min_value=0.0,
        max_value=1.0,
        help_text="Spill only while the endpoint's KV cache, with the request, is at most this full.",
    )
    min_home_inflight = serializers.IntegerField(
        required=False,
        min_value=0,
        help_text="Spill only when the rule's own pool has at least this many in flight on every endpoint.",
    )


class RouteRuleSerializer(serializers.Serializer):
    match = RuleMatchSerializer(required=False)
    pool = serializers.CharField(help_text="The name of the pool this rule sends to.")
    spill = RouteSpillSerializer(required=False)


@extend_schema_field(RouteRuleSerializer(many=True))
class RulesField(serializers.JSONField):
    pass


@extend_schema_field(serializers.DictField(child=serializers.FloatField(min_value=0)))
class ScorerWeightsField(serializers.JSONField):
    pass


class RoutePoolSerializer(StrictModelSerializer):
    scorer_weights = ScorerWeightsField(required=False)

    class Meta:
        model = RoutePool
        fields = [
            "id",
            "name",
            "alias",
            "role",
            "model_version",
            "scorer",
            "scorer_weights",
            "session_header",
            "connect_timeout_s",
            "first_byte_timeout_s",
            "inter_token_timeout_s",
            "total_timeout_s",
            "max_retries",
            "max_inflight_per_endpoint",
            "batch_max_fraction",
            "sleep_idle_seconds",
            "sleep_level",
            "scale_to_zero",
            "wake_timeout_s",
            "updated_at",
        ]
        read_only_fields = ["id", "updated_at"]
        extra_kwargs = {
            "sleep_idle_seconds": {
                "help_text": "Put the pool's engines to sleep after this many idle seconds; null: never."
            },
            "sleep_level": {"help_text": "1: weights to host memory, KV cache freed; 2: both dropped."},
            "scale_to_zero": {
                "help_text": "Let every engine sleep (otherwise one stays awake); "
                "the first request wakes one."
            },
            "wake_timeout_s": {
                "help_text": "How long the proxy holds a request while an engine wakes; "
                "then 503 + Retry-After."
            },
        }

    def validate_scorer_weights(self, value: Any) -> dict[str, float]:
        if not isinstance(value, dict):
            raise serializers.ValidationError('Must be an object such as {"load": 1, "kv": 1}.')
        unknown = sorted(set(value) - WEIGHT_NAMES)
        if unknown:
            raise serializers.ValidationError(f"Unknown weights {unknown}; use load, kv, prefix.")
        for name, weight in value.items():
            if isinstance(weight, bool) or not isinstance(weight, int | float) or weight < 0:
                raise serializers.ValidationError(f"Weight '{name}' must be a non-negative number.")
        return {k: float(v) for k, v in value.items()}

    def validate(self, attrs: Any) -> Any:
        attrs = super().validate(attrs)
        for name in ("connect_timeout_s", "first_byte_timeout_s", "inter_token_timeout_s", "total_timeout_s"):
            value = attrs.get(name)
            if value is not None and value <= 0:
                raise serializers.ValidationError({name: ["Must be greater than 0 seconds."]})
        version = attrs.get("model_version", getattr(self.instance, "model_version", None))
        alias_name = attrs.get("alias", getattr(self.instance, "alias", None))
        self._validate_sleep(attrs, alias_name, version)
        alias = ModelAlias.objects.select_related("active_version").filter(name=alias_name).first()
        if version is not None and alias is not None and version.model_id != alias.active_version.model_id:
            raise serializers.ValidationError(
                {
                    "model_version": [
                        f"Version {version} is not a version of the model behind '{alias.name}' "
                        f"({alias.active_version}); a pool serves one model."
                    ]
                }
            )
        return attrs

    def _validate_sleep(self, attrs: Any, alias: str | None, version: Any) -> None:
        def value(name: str) -> Any:
            if name in attrs:
                return attrs[name]
            return (
                getattr(self.instance, name)
                if self.instance is not None
                else getattr(RoutePool._meta.get_field(name), "default", None)
            )

        errors: dict[str, list[str]] = {}
        if value("sleep_level") not in SLEEP_LEVELS:
            errors["sleep_level"] = [
                "Sleep level must be 1 (weights to host memory) or 2 (weights dropped), "
                f"not {value('sleep_level')}."
            ]
        if value("wake_timeout_s") <= 0:
            errors["wake_timeout_s"] = ["Must be greater than 0 seconds."]
        idle = value("sleep_idle_seconds")
        if value("scale_to_zero") and idle is None:
            errors["scale_to_zero"] = [
                "Scale to zero needs sleep_idle_seconds: how long idle before sleeping."
            ]
        if idle is not None and alias:
            problem = pool_sleep_problem(alias, value("role") or "", getattr(version, "pk", None))
            if problem:
                errors["sleep_idle_seconds"] = [problem]
        if errors:
            raise serializers.ValidationError(errors)


class RoutePolicySerializer(StrictModelSerializer):
    rules = RulesField(required=False)
    default_pool = serializers.SlugRelatedField(
        slug_field="name", queryset=RoutePool.objects.all(), allow_null=True, required=False
    )
    fallback_pool = serializers.SlugRelatedField(
        slug_field="name", queryset=RoutePool.objects.all(), allow_null=True, required=False
    )

    class Meta:
        model = RoutePolicy
        fields = ["id", "name", "alias", "rules", "default_pool", "fallback_pool", "updated_at"]
        read_only_fields = ["id", "updated_at"]

    def validate_rules(self, value: Any) -> list[dict[str, Any]]:
        if not isinstance(value, list):
            raise serializers.ValidationError('Must be a list of {"match": {...}, "pool": name}.')
        pools = set(RoutePool.objects.values_list("name", flat=True))
        for i, raw in enumerate(value):
            try:
                rule = parse_rule(raw)
            except ValueError as exc:
                raise serializers.ValidationError(f"rules[{i}]: {exc}") from None
            if rule.pool not in pools:
                raise serializers.ValidationError(f"rules[{i}]: no pool named '{rule.pool}'.")
            if rule.spill is not None and rule.spill.pool not in pools:
                raise serializers.ValidationError(
                    f"rules[{i}]: no pool named '{rule.spill.pool}' to spill onto."
                )
        return value


class RequestLogStageSerializer(serializers.Serializer):
    """One stage of the request's chain in the request log (routing/proxy/pipeline/stages.py:columns)."""

    name = serializers.CharField()
    kind = serializers.CharField(help_text="guard, classify, cache, ...")
    outcome = serializers.CharField(
        help_text='pass, hit, miss, bypass, skip, masked, blocked, "not run", ...'
    )
    ms = serializers.FloatField(help_text="Milliseconds in the stage's hooks for this request.")


class RequestLogListSerializer(serializers.ListSerializer):
    """A page of the log: the names its rows mention are looked up once for the page (LogNames.of)."""

    def to_representation(self, data: Any) -> list[dict[str, Any]]:
        rows = list(data.all() if hasattr(data, "all") else data)
        self.child.names = LogNames.of(rows)  # type: ignore[union-attr]
        return [self.child.to_representation(row) for row in rows]  # type: ignore[union-attr]


class RequestLogSerializer(serializers.ModelSerializer):
    """One request as the log keeps it, with the names of the deployment, model version and key it
    mentions by id (null when that row is gone: the log outlives what it names)."""

    stages = RequestLogStageSerializer(
        many=True,
        read_only=True,
        allow_null=True,
        help_text="Per stage of the request's chain; null without one.",
    )
    deployment_name = serializers.SerializerMethodField(
        help_text="The deployment's name; null when deleted or when no engine saw the request."
    )
    model_version_name = serializers.SerializerMethodField(
        help_text="The answering version as model@revision; null when deleted or none answered."
    )
    key_id = serializers.SerializerMethodField(
        help_text="The API key's id (tenant and prefix match); null when the key is gone or unknown."
    )
    key_name = serializers.SerializerMethodField(help_text="The API key's name; null like key_id.")

    class Meta:
        model = RequestLog
        list_serializer_class = RequestLogListSerializer
        # The columns the proxy writes, in its order: one list, so a new column cannot be missed here.
        fields = [
            "id",
            *REQUEST_LOG_COLUMNS,
            "deployment_name",
            "model_version_name",
            "key_id",
            "key_name",
        ]
        read_only_fields = fields

    names: LogNames | None = None

    def to_representation(self, instance: RequestLog) -> dict[str, Any]:
        if self.names is None:  # one row (retrieve); a page sets them in RequestLogListSerializer
            self.names = LogNames.of([instance])
        return super().to_representation(instance)

    def _names(self) -> LogNames:
        assert self.names is not None
        return self.names

    def get_deployment_name(self, row: RequestLog) -> str | None:
        return None if row.deployment_id is None else self._names().deployments.get(row.deployment_id)

    def get_model_version_name(self, row: RequestLog) -> str | None:
        return None if row.model_version_id is None else self._names().versions.get(row.model_version_id)

    def _key(self, row: RequestLog) -> tuple[int, str] | None:
        return self._names().keys.get((row.tenant_id, row.key_prefix)) if row.key_prefix else None

    def get_key_id(self, row: RequestLog) -> int | None:
        key = self._key(row)
        return None if key is None else key[0]

    def get_key_name(self, row: RequestLog) -> str | None:
        key = self._key(row)
        return None if key is None else key[1]


class UsageBucketSerializer(serializers.Serializer):
    hour = serializers.DateTimeField()
    requests = serializers.IntegerField()
    # DRF's metaclass takes declared fields off the class, so `errors` does not shadow Serializer.errors.
    errors = serializers.IntegerField(help_text="Answers with status 400 or above.")  # type: ignore[assignment]
    refused = serializers.IntegerField(
        help_text="Requests refused or failed before any answer (no tokens generated, none billed)."
    )
    prompt_tokens = serializers.IntegerField(help_text="Prompt tokens of admitted requests only.")
    completion_tokens = serializers.IntegerField(help_text="Completion tokens of admitted requests only.")


class RoutedTrafficSerializer(serializers.Serializer):
    """Requests a policy sent to a pool, per deployment (none: the pool had no healthy endpoint)."""

    route_pool = serializers.CharField()
    deployment_id = serializers.IntegerField(allow_null=True)
    upstream = serializers.CharField(allow_blank=True)
    requests = serializers.IntegerField()
    errors = serializers.IntegerField(help_text="Answers with status 500 or above.")  # type: ignore[assignment]
    tokens = serializers.IntegerField(allow_null=True, help_text="Completion tokens.")


class RefusedTrafficSerializer(serializers.Serializer):
    """Requests refused before any pool was chosen (limits, bad requests, unknown models), per reason."""

    status = serializers.IntegerField()
    error_type = serializers.CharField(allow_blank=True)
    requests = serializers.IntegerField()


class TrafficSerializer(serializers.Serializer):
    minutes = serializers.IntegerField()
    routed = RoutedTrafficSerializer(many=True)
    refused = RefusedTrafficSerializer(many=True)


class EnginePredictionSerializer(serializers.Serializer):
    """One engine's latency predictor, merged over the proxy processes (routing/predictions.py)."""

    deployment_id = serializers.IntegerField()
    deployment = serializers.CharField()
    samples = serializers.IntegerField(help_text="Answered streams the predictors learnt from.")
    warm = serializers.BooleanField(help_text="Enough samples for the predicted scorers to use it.")
    ttft_predicted_s = serializers.FloatField(allow_null=True, help_text="Last prediction, seconds.")
    ttft_observed_s = serializers.FloatField(allow_null=True, help_text="What that request took, seconds.")
    tpot_predicted_s = serializers.FloatField(allow_null=True)
    tpot_observed_s = serializers.FloatField(allow_null=True)
    ttft_mape_pct = serializers.FloatField(
        allow_null=True, help_text="Mean absolute percentage error over recent warm predictions."
    )
    tpot_mape_pct = serializers.FloatField(allow_null=True)
    peak_tokens_per_s = serializers.FloatField(
        allow_null=True,
        help_text="Best recent output rate: the slo_cost scorer's cost per token divides by it.",
    )


class PoolPredictionsSerializer(serializers.Serializer):
    pool = serializers.CharField()
    alias = serializers.CharField()
    scorer = serializers.CharField()
    engines = EnginePredictionSerializer(many=True)
