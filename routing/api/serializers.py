"""Serializers for route pools, policies and the request log."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from core.api.base import StrictModelSerializer
from routing.models import RequestLog, RoutePolicy, RoutePool
from routing.proxy.config import parse_rule
from routing.proxy.requestlog import COLUMNS as REQUEST_LOG_COLUMNS

WEIGHT_NAMES = {"load", "kv", "prefix"}


class RoutePoolSerializer(StrictModelSerializer):
    class Meta:
        model = RoutePool
        fields = [
            "id",
            "name",
            "alias",
            "role",
            "scorer",
            "scorer_weights",
            "session_header",
            "connect_timeout_s",
            "first_byte_timeout_s",
            "total_timeout_s",
            "max_retries",
            "max_inflight_per_endpoint",
            "batch_max_fraction",
            "updated_at",
        ]
        read_only_fields = ["id", "updated_at"]

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
        for name in ("connect_timeout_s", "first_byte_timeout_s", "total_timeout_s"):
            value = attrs.get(name)
            if value is not None and value <= 0:
                raise serializers.ValidationError({name: ["Must be greater than 0 seconds."]})
        return attrs


class RoutePolicySerializer(StrictModelSerializer):
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
        return value


class RequestLogSerializer(serializers.ModelSerializer):
    class Meta:
        model = RequestLog
        # The columns the proxy writes, in its order: one list, so a new column cannot be missed here.
        fields = ["id", *REQUEST_LOG_COLUMNS]
        read_only_fields = fields
