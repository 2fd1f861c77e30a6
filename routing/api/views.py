"""Admin API for routing: pools, policies (changes pushed to every proxy), request log and usage."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db.models import Count, Q, Sum
from django.db.models.functions import TruncHour
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import viewsets
from rest_framework.decorators import api_view
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response

from core.api.base import AuditedModelViewSet
from core.redis_client import publish_config_change
from routing.api.request_log import RequestLogFilter
from routing.api.serializers import (
    RequestLogSerializer,
    RoutePolicySerializer,
    RoutePoolSerializer,
    TrafficSerializer,
    UsageBucketSerializer,
)
from routing.cost import ADMITTED
from routing.models import RequestLog, RoutePolicy, RoutePool
from routing.scaling.sleep import enable_sleep_for_pool


class NotifyProxiesMixin:
    """Every write tells the proxies to reload their routing snapshot once the transaction commits."""

    config_kind = "routing"

    def perform_create(self, serializer: Any) -> None:
        super().perform_create(serializer)  # type: ignore[misc]
        publish_config_change(self.config_kind)

    def perform_update(self, serializer: Any) -> None:
        super().perform_update(serializer)  # type: ignore[misc]
        publish_config_change(self.config_kind)

    def perform_destroy(self, instance: Any) -> None:
        super().perform_destroy(instance)  # type: ignore[misc]
        publish_config_change(self.config_kind)


class RoutePoolViewSet(NotifyProxiesMixin, AuditedModelViewSet):
    queryset = RoutePool.objects.all()
    serializer_class = RoutePoolSerializer
    config_kind = "route_pool"
    filterset_fields = ["alias", "scorer"]
    search_fields = ["name", "alias"]

    def perform_create(self, serializer: Any) -> None:
        super().perform_create(serializer)
        enable_sleep_for_pool(serializer.instance)

    def perform_update(self, serializer: Any) -> None:
        super().perform_update(serializer)
        enable_sleep_for_pool(serializer.instance)


class RoutePolicyViewSet(NotifyProxiesMixin, AuditedModelViewSet):
    queryset = RoutePolicy.objects.select_related("default_pool", "fallback_pool")
    serializer_class = RoutePolicySerializer
    config_kind = "route_policy"
    filterset_fields = ["alias"]
    search_fields = ["name", "alias"]


class RequestLogPagination(CursorPagination):
    # Keyset pagination on the (created_at) index: page 10,000 costs what page 1 costs.
    ordering = ("-created_at", "-id")
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


class RequestLogViewSet(viewsets.ReadOnlyModelViewSet):
    """The request log, newest first; find one request by its id, filter by tenant, key, alias, status,
    deployment, model version and time (routing/api/request_log.py)."""

    queryset = RequestLog.objects.all()
    serializer_class = RequestLogSerializer
    filterset_class = RequestLogFilter
    pagination_class = RequestLogPagination
    ordering_fields: list[str] = []
    search_fields: list[str] = []


def _window(request: Request, default_hours: int) -> dt.datetime:
    raw = request.query_params.get("hours", str(default_hours))
    try:
        hours = int(raw)
    except ValueError:
        raise ValidationError({"hours": ["Must be an integer."]}) from None
    if not 1 <= hours <= 24 * 31:
        raise ValidationError({"hours": ["Must be between 1 and 744."]})
    return timezone.now() - dt.timedelta(hours=hours)


@extend_schema(
    parameters=[
        OpenApiParameter("hours", int, description="The window, 1 to 744 hours (default 24)."),
        OpenApiParameter("tenant_id", int, description="Only this tenant's requests."),
    ],
    responses={200: UsageBucketSerializer(many=True)},
)
@api_view(["GET"])
def usage(request: Request) -> Response:
    """Hourly requests, errors and tokens for one tenant (or all), over the last `hours` (default 24).
    Tokens are those of admitted requests; `refused` counts those that got no answer (routing/cost.py)."""
    since = _window(request, 24)
    rows = RequestLog.objects.filter(created_at__gte=since)
    tenant = request.query_params.get("tenant_id")
    if tenant:
        # isascii: str.isdigit() also accepts digits int() refuses ("²"), which was a 500.
        if not (tenant.isascii() and tenant.isdigit()):
            raise ValidationError({"tenant_id": ["Must be an integer."]})
        rows = rows.filter(tenant_id=int(tenant))
    buckets = (
        rows.annotate(hour=TruncHour("created_at"))
        .values("hour")
        .annotate(
            requests=Count("id"),
            errors=Count("id", filter=Q(status__gte=400)),
            refused=Count("id", filter=~ADMITTED),
            # Tokens of admitted work only: a refused request's prompt was counted, never served.
            prompt_tokens=Sum("prompt_tokens", filter=ADMITTED),
            completion_tokens=Sum("completion_tokens", filter=ADMITTED),
        )
        .order_by("hour")
    )
    hourly = [
        {
            "hour": b["hour"],
            "requests": b["requests"],
            "errors": b["errors"],
            "refused": b["refused"],
            "prompt_tokens": b["prompt_tokens"] or 0,
            "completion_tokens": b["completion_tokens"] or 0,
        }
        for b in buckets
    ]
    return Response(UsageBucketSerializer(hourly, many=True).data)


@extend_schema(
    parameters=[OpenApiParameter("minutes", int, description="The window, 1 to 1440 minutes (default 5).")],
    responses={200: TrafficSerializer},
)
@api_view(["GET"])
def traffic(request: Request) -> Response:
    """Traffic over the last `minutes` (default 5): routed requests per pool and deployment, and apart
    from them the requests refused before routing (no pool chosen), per status and error type."""
    raw = request.query_params.get("minutes", "5")
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= 1440:
        raise ValidationError({"minutes": ["Must be an integer from 1 to 1440."]})
    since = timezone.now() - dt.timedelta(minutes=int(raw))
    recent = RequestLog.objects.filter(created_at__gte=since)
    routed = (
        recent.exclude(route_pool="")
        .values("route_pool", "deployment_id", "upstream")
        .annotate(
            requests=Count("id"),
            errors=Count("id", filter=Q(status__gte=500)),
            tokens=Sum("completion_tokens"),
        )
        .order_by("route_pool", "-requests")
    )
    refused = (
        recent.filter(route_pool="")
        .values("status", "error_type")
        .annotate(requests=Count("id"))
        .order_by("-requests", "status", "error_type")
    )
    body = {"minutes": int(raw), "routed": list(routed), "refused": list(refused)}
    return Response(TrafficSerializer(body).data)
