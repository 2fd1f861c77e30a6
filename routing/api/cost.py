"""Cost per output token and tenants' spend over a window (routing/cost.py does the arithmetic)."""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.base import StrictSerializerMixin
from routing import cost

MAX_WINDOW = dt.timedelta(days=31)


class CostWindowQuerySerializer(StrictSerializerMixin, serializers.Serializer):
    """The window: the last `hours` (default 24), or `since` to `until` (until defaults to now)."""

    hours = serializers.IntegerField(
        required=False, min_value=1, max_value=24 * 31, help_text="The last N hours, 1 to 744 (default 24)."
    )
    since = serializers.DateTimeField(required=False, help_text="Window start (ISO 8601); not with hours.")
    until = serializers.DateTimeField(required=False, help_text="Window end (ISO 8601); default now.")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        now = timezone.now()
        if "hours" in attrs and ("since" in attrs or "until" in attrs):
            raise serializers.ValidationError({"hours": ["Give hours, or since/until, not both."]})
        until = attrs.get("until", now)
        since = attrs.get("since", until - dt.timedelta(hours=attrs.get("hours", 24)))
        if since >= until:
            raise serializers.ValidationError({"since": ["Must be before until."]})
        if until - since > MAX_WINDOW:
            raise serializers.ValidationError({"since": ["The window is at most 31 days."]})
        if since >= now:
            raise serializers.ValidationError({"since": ["Must be in the past."]})
        # The future has cost nothing yet (a running deployment would be charged for hours to come):
        # the window ends now at the latest, and the answer says which window it used.
        until = min(until, now)
        return {**attrs, "window": cost.Window(start=since, end=until)}


class DeploymentCostQuerySerializer(CostWindowQuerySerializer):
    deployment_id = serializers.IntegerField(required=False, help_text="Only this deployment.")


class TenantCostQuerySerializer(CostWindowQuerySerializer):
    tenant_id = serializers.IntegerField(required=False, help_text="Only this tenant.")


class CostWindowSerializer(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    hours = serializers.FloatField()


class DeploymentCostSerializer(serializers.Serializer):
    deployment_id = serializers.IntegerField()
    deployment = serializers.CharField()
    host = serializers.CharField()
    gpus_held = serializers.IntegerField()
    host_gpus = serializers.IntegerField()
    host_cost_per_hour = serializers.FloatField()
    running_hours = serializers.FloatField(help_text="Hours of the window it held its GPUs (active states).")
    cost = serializers.FloatField(help_text="Its share of its host's cost over the window.")
    output_tokens = serializers.IntegerField()
    cost_per_million_output_tokens = serializers.FloatField(
        allow_null=True, help_text="Null when it generated no tokens in the window."
    )


class PoolCostSerializer(serializers.Serializer):
    pool = serializers.CharField()
    alias = serializers.CharField()
    implicit = serializers.BooleanField(
        help_text="The proxy's own pool for an alias without pools (named after it; no route-pool row)."
    )
    deployments = serializers.ListField(child=serializers.CharField())
    cost = serializers.FloatField()
    output_tokens = serializers.IntegerField()
    cost_per_million_output_tokens = serializers.FloatField(allow_null=True)


class PoolSpendSerializer(serializers.Serializer):
    pool = serializers.CharField()
    output_tokens = serializers.IntegerField()
    spend = serializers.FloatField()


class TenantUsageSerializer(serializers.Serializer):
    tenant_id = serializers.IntegerField()
    tenant = serializers.CharField()
    requests = serializers.IntegerField(
        help_text="Admitted requests: answered (below 400), or failed after the engine began answering."
    )
    prompt_tokens = serializers.IntegerField(help_text="Prompt tokens of admitted requests.")
    output_tokens = serializers.IntegerField(help_text="Output tokens of admitted requests.")
    refused_requests = serializers.IntegerField(
        help_text="Requests refused before any answer (4xx: scope, quota, rate limit, "
        "context checks, bad input): not in the usage or spend."
    )
    refused_prompt_tokens = serializers.IntegerField(
        help_text="Prompt tokens the refused requests carried: counted at the door, not billed."
    )
    failed_requests = serializers.IntegerField(
        help_text="Requests that failed before any answer (5xx): not in the usage or spend."
    )
    spend = serializers.FloatField(
        help_text="Its output tokens in each pool times that pool's cost per token."
    )
    unpriced_output_tokens = serializers.IntegerField(help_text="Output tokens of requests no pool routed.")
    by_pool = PoolSpendSerializer(many=True)
    daily_token_budget = serializers.IntegerField(allow_null=True)
    daily_tokens_used = serializers.IntegerField(help_text="Tokens used today (UTC), as the limiter counts.")
    daily_budget_used_ratio = serializers.FloatField(allow_null=True)


class DeploymentCostListSerializer(serializers.Serializer):
    window = CostWindowSerializer()
    results = DeploymentCostSerializer(many=True)


class PoolCostListSerializer(serializers.Serializer):
    window = CostWindowSerializer()
    results = PoolCostSerializer(many=True)


class TenantUsageListSerializer(serializers.Serializer):
    window = CostWindowSerializer()
    results = TenantUsageSerializer(many=True)


def _body(window: cost.Window, rows: list[Any]) -> dict[str, Any]:
    return {
        "window": {"start": window.start, "end": window.end, "hours": window.hours},
        "results": [asdict(r) for r in rows],
    }


@extend_schema(parameters=[DeploymentCostQuerySerializer], responses={200: DeploymentCostListSerializer})
@api_view(["GET"])
def deployment_costs(request: Request) -> Response:
    """Each deployment's cost, output tokens and cost per million output tokens over the window."""
    query = DeploymentCostQuerySerializer(data=request.query_params)
    query.is_valid(raise_exception=True)
    window, only = query.validated_data["window"], query.validated_data.get("deployment_id")
    rows = cost.deployment_costs(window, None if only is None else [only])
    return Response(DeploymentCostListSerializer(_body(window, rows)).data)


@extend_schema(parameters=[CostWindowQuerySerializer], responses={200: PoolCostListSerializer})
@api_view(["GET"])
def pool_costs(request: Request) -> Response:
    """Each route pool's cost, output tokens and cost per million output tokens over the window."""
    query = CostWindowQuerySerializer(data=request.query_params)
    query.is_valid(raise_exception=True)
    window = query.validated_data["window"]
    return Response(PoolCostListSerializer(_body(window, cost.pool_costs(window))).data)


@extend_schema(parameters=[TenantCostQuerySerializer], responses={200: TenantUsageListSerializer})
@api_view(["GET"])
def tenant_usage(request: Request) -> Response:
    """Each tenant's requests, tokens and spend over the window, and its daily token budget used today."""
    query = TenantCostQuerySerializer(data=request.query_params)
    query.is_valid(raise_exception=True)
    window, only = query.validated_data["window"], query.validated_data.get("tenant_id")
    rows = cost.tenant_usage(window, None if only is None else [only])
    return Response(TenantUsageListSerializer(_body(window, rows)).data)
