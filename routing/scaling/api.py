"""Scaling policies of route pools and their decisions (routing/scaling/autoscaler.py, docs/autoscaling.md).

Everyone signed in reads; admins write (console.permissions). A policy is checked when saved (bounds,
the pool's hosts, the template's fit) and refused with field errors.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.base import AuditedModelViewSet, StrictModelSerializer
from routing.scaling import autoscaler
from routing.scaling.models import ScalingDecision, ScalingPolicy


class ScalingDecisionSerializer(serializers.ModelSerializer):
    class Meta:
        model = ScalingDecision
        fields = [
            "id",
            "at",
            "action",
            "reason",
            "engines_before",
            "engines_after",
            "metrics",
            "deployment",
            "deployment_name",
            "host_name",
        ]
        read_only_fields = fields


class PoolEnginesSerializer(serializers.Serializer):
    serving = serializers.IntegerField()
    starting = serializers.IntegerField()
    draining = serializers.IntegerField()


class ScalingPolicySerializer(StrictModelSerializer):
    pool_name = serializers.CharField(source="pool.name", read_only=True)
    template_name = serializers.CharField(source="template.name", read_only=True)
    engines = serializers.SerializerMethodField()

    class Meta:
        model = ScalingPolicy
        fields = [
            "id",
            "pool",
            "pool_name",
            "template",
            "template_name",
            "enabled",
            "min_engines",
            "max_engines",
            "target_waiting_per_engine",
            "target_kv_usage",
            "target_ttft_ratio",
            "scale_up_cooldown_s",
            "scale_down_cooldown_s",
            "evaluation_interval_s",
            "engines",
            "last_evaluated_at",
            "last_target_engines",
            "last_reason",
            "last_metrics",
            "created_at",
            "updated_at",
        ]
        read_only_fields = [
            "last_evaluated_at",
            "last_target_engines",
            "last_reason",
            "last_metrics",
            "created_at",
            "updated_at",
        ]

    @extend_schema_field(PoolEnginesSerializer)
    def get_engines(self, obj: ScalingPolicy) -> dict[str, int]:
        """The pool's engines now: serving, starting, and draining (being removed)."""
        counts = autoscaler.engine_counts(obj)
        return dict(PoolEnginesSerializer(counts).data)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        def value(name: str) -> Any:
            if name in attrs:
                return attrs[name]
            if self.instance is not None:
                return getattr(self.instance, name)
            field = ScalingPolicy._meta.get_field(name)
            return field.get_default() if isinstance(field, models.Field) else None

        errors = autoscaler.validate_policy(
            value("pool"), value("template"), int(value("min_engines")), int(value("max_engines"))
        )
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


class ScalingPolicyViewSet(AuditedModelViewSet):
    """A route pool's scaling policy, its live engine count and its decision history."""

    serializer_class = ScalingPolicySerializer
    queryset = ScalingPolicy.objects.select_related("pool", "template")
    filterset_fields = ["pool", "enabled"]
    ordering_fields = ["pool__name", "updated_at"]

    @extend_schema(responses={200: ScalingDecisionSerializer(many=True)})
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def decisions(self, request: Request, pk: str | None = None) -> Response:
        """The pool's scaling history, newest first (the last 200 decisions)."""
        policy = self.get_object()
        return Response(ScalingDecisionSerializer(policy.decisions.all()[:200], many=True).data)
