"""Alerts API: alerts (firing, resolved, pending) with their history, acknowledge, the rule editor.

Everyone signed in reads; admins acknowledge and edit rules (console.permissions). Rule edits go
through AuditedModelViewSet, so each leaves an audit event with before/after.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action, api_view
from rest_framework.exceptions import APIException
from rest_framework.request import Request
from rest_framework.response import Response

from alerts import health, services
from alerts.api.serializers import (
    AlertDetailSerializer,
    AlertEventSerializer,
    AlertRuleSerializer,
    AlertSerializer,
    AlertSummarySerializer,
    FleetHealthQuerySerializer,
    FleetHealthSerializer,
    RuleInfoSerializer,
)
from alerts.choices import AlertState
from alerts.models import Alert, AlertEvent, AlertRule
from alerts.rules import RULES
from core.api.base import AuditedModelViewSet


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"


class AlertViewSet(viewsets.ReadOnlyModelViewSet):
    """Alerts, newest first; filter by state (firing, resolved, pending), metric or severity."""

    filterset_fields = ["state", "metric", "severity"]
    search_fields = ["subject", "summary", "fingerprint"]
    ordering_fields = ["started_at", "fired_at", "resolved_at"]

    def get_queryset(self) -> QuerySet[Alert]:
        qs = Alert.objects.all()
        if self.action == "retrieve":
            qs = qs.prefetch_related("events", "notifications")
        return qs

    def get_serializer_class(self) -> type[serializers.BaseSerializer[Any]]:
        return AlertDetailSerializer if self.action == "retrieve" else AlertSerializer

    @extend_schema(request=None, responses={200: AlertDetailSerializer})
    @action(detail=True, methods=["post"])
    def acknowledge(self, request: Request, pk: str | None = None) -> Response:
        """Say you have seen a firing alert (kept with your name and the time, and audited)."""
        try:
            alert = services.acknowledge(self.get_object(), request.user)
        except services.AlertStateError as exc:
            raise Conflict(str(exc)) from None
        fresh = Alert.objects.prefetch_related("events", "notifications").get(pk=alert.pk)
        return Response(AlertDetailSerializer(fresh).data)

    @extend_schema(responses={200: AlertSummarySerializer})
    @action(detail=False, methods=["get"])
    def summary(self, request: Request) -> Response:
        """Counts for the header badge."""
        qs = Alert.objects.all()
        return Response(
            AlertSummarySerializer(
                {
                    "firing": qs.filter(state=AlertState.FIRING).count(),
                    "unacknowledged": qs.filter(state=AlertState.FIRING, acknowledged_at=None).count(),
                    "pending": qs.filter(state=AlertState.PENDING).count(),
                    "webhook_configured": bool(settings.ALERT_WEBHOOK_URL),
                }
            ).data
        )


class AlertEventViewSet(viewsets.ReadOnlyModelViewSet):
    """The history of every alert: pending, firing, resolved, acknowledged (who, when), newest first."""

    serializer_class = AlertEventSerializer
    filterset_fields = ["alert", "kind"]

    def get_queryset(self) -> QuerySet[AlertEvent]:
        return AlertEvent.objects.select_related("alert")


class AlertRuleViewSet(AuditedModelViewSet):
    """Rules: the fleet-wide row of each (listed at the defaults until edited) and per-deployment or
    per-pool overrides. Edits are refused with field errors and audited."""

    serializer_class = AlertRuleSerializer
    filterset_fields = ["metric", "deployment", "pool", "enabled"]
    http_method_names = ["get", "post", "patch", "put", "delete", "head", "options"]

    def get_queryset(self) -> QuerySet[AlertRule]:
        return AlertRule.objects.select_related("deployment", "pool")

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        services.ensure_default_rules()
        return super().list(request, *args, **kwargs)

    def perform_destroy(self, instance: AlertRule) -> None:
        if instance.scope == "fleet":
            raise Conflict("A fleet-wide rule cannot be deleted; set enabled to false to switch it off.")
        super().perform_destroy(instance)


@extend_schema(responses={200: RuleInfoSerializer(many=True)})
@api_view(["GET"])
def rule_catalogue(request: Request) -> Response:
    """The rules there are: the Prometheus alert each mirrors, its defaults, units and scopes."""
    return Response(RuleInfoSerializer([r.as_dict() for r in RULES], many=True).data)


@extend_schema(parameters=[FleetHealthQuerySerializer], responses={200: FleetHealthSerializer})
@api_view(["GET"])
def fleet_health(request: Request) -> Response:
    """The fleet's health first: request rate, error rate (4xx and 5xx apart), p50/p99 latency and TTFT
    of the fleet and each pool over `window`, from the rollups beat keeps, and the hosts down with their
    alerts (docs/monitoring.md "Health on the dashboard")."""
    query = FleetHealthQuerySerializer(data=request.query_params)
    query.is_valid(raise_exception=True)
    params: dict[str, Any] = query.validated_data
    # Plain numbers already: up to 1,440 points per series are not passed through DRF's fields one by one.
    return Response(health.fleet_health(params["window"], timezone.now(), params["hosts"]))
