"""Serializers of the alerts API: rules (with their catalogue entry), alerts, their history."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from alerts import health
from alerts.choices import AlertState, Metric, Severity
from alerts.models import Alert, AlertEvent, AlertNotification, AlertRule
from alerts.rules import BY_METRIC, MAX_FOR_SECONDS
from alerts.services import RuleError, validate_rule
from core.api.base import StrictModelSerializer, StrictSerializerMixin
from routing.rollups import health as request_health


class RuleInfoSerializer(serializers.Serializer):
    """One rule of the catalogue: the Prometheus alert it mirrors and its defaults."""

    metric = serializers.ChoiceField(choices=Metric.choices)
    alert = serializers.CharField()
    title = serializers.CharField()
    severity = serializers.CharField()
    threshold = serializers.FloatField(allow_null=True, help_text="Default threshold; null: none to tune.")
    threshold_max = serializers.FloatField(allow_null=True)
    unit = serializers.CharField(allow_blank=True)
    for_seconds = serializers.IntegerField(help_text="Default for-duration, seconds.")
    scopes = serializers.ListField(child=serializers.CharField(), help_text="deployment and/or pool")
    condition = serializers.CharField()


class AlertRuleSerializer(StrictModelSerializer):
    metric = serializers.ChoiceField(choices=Metric.choices)
    threshold = serializers.FloatField(allow_null=True, required=False, default=None)
    for_seconds = serializers.IntegerField(
        min_value=0, max_value=MAX_FOR_SECONDS, help_text="How long the condition must hold before it fires."
    )
    scope = serializers.CharField(read_only=True, help_text="fleet, deployment or pool")
    deployment_name = serializers.CharField(source="deployment.name", read_only=True, default=None)
    pool_name = serializers.CharField(source="pool.name", read_only=True, default=None)
    alert = serializers.SerializerMethodField()
    severity = serializers.SerializerMethodField()
    unit = serializers.SerializerMethodField()

    class Meta:
        model = AlertRule
        fields = [
            "id",
            "metric",
            "scope",
            "deployment",
            "deployment_name",
            "pool",
            "pool_name",
            "threshold",
            "for_seconds",
            "enabled",
            "alert",
            "severity",
            "unit",
            "updated_at",
        ]
        read_only_fields = [
            "id",
            "scope",
            "deployment_name",
            "pool_name",
            "alert",
            "severity",
            "unit",
            "updated_at",
        ]

    def get_alert(self, obj: AlertRule) -> str:
        return BY_METRIC[obj.metric].alert

    def get_severity(self, obj: AlertRule) -> str:
        return BY_METRIC[obj.metric].severity

    def get_unit(self, obj: AlertRule) -> str:
        return BY_METRIC[obj.metric].unit

    def validate(self, attrs: Any) -> Any:
        attrs = super().validate(attrs)
        instance: AlertRule | None = self.instance
        if instance is not None:
            for name in ("metric", "deployment", "pool"):
                if name in attrs and attrs[name] != getattr(instance, name):
                    raise serializers.ValidationError(
                        {name: ["A rule's metric and scope are fixed; create another rule instead."]}
                    )
        metric = attrs.get("metric", getattr(instance, "metric", None))
        deployment = attrs.get("deployment", getattr(instance, "deployment", None))
        pool = attrs.get("pool", getattr(instance, "pool", None))
        if deployment is not None and pool is not None:
            raise serializers.ValidationError({"pool": ["Name a deployment or a pool, not both."]})
        if instance is None and deployment is None and pool is None:
            raise serializers.ValidationError(
                {
                    "non_field_errors": [
                        "Fleet-wide rules exist already; edit one, or name a deployment or a pool."
                    ]
                }
            )
        scope = "deployment" if deployment is not None else "pool" if pool is not None else "fleet"
        threshold = attrs["threshold"] if "threshold" in attrs else getattr(instance, "threshold", None)
        if instance is None and "threshold" not in self.initial_data and metric in BY_METRIC:
            # An override without a threshold starts at the rule's default.
            threshold = attrs["threshold"] = BY_METRIC[metric].threshold
        for_seconds = attrs.get("for_seconds", getattr(instance, "for_seconds", None))
        try:
            validate_rule(str(metric), threshold, for_seconds, scope)
        except RuleError as exc:
            raise serializers.ValidationError({exc.field: [exc.message]}) from None
        if instance is None:
            clash = AlertRule.objects.filter(metric=metric, deployment=deployment, pool=pool)
            if clash.exists():
                raise serializers.ValidationError(
                    {scope: [f"This {scope} has a {metric} rule already; edit it."]}
                )
        return attrs


class AlertSerializer(serializers.ModelSerializer):
    alert = serializers.SerializerMethodField()

    class Meta:
        model = Alert
        fields = [
            "id",
            "metric",
            "alert",
            "fingerprint",
            "subject",
            "labels",
            "severity",
            "state",
            "summary",
            "value",
            "threshold",
            "for_seconds",
            "started_at",
            "last_seen_at",
            "fired_at",
            "resolved_at",
            "acknowledged_by",
            "acknowledged_by_name",
            "acknowledged_at",
        ]
        read_only_fields = fields

    def get_alert(self, obj: Alert) -> str:
        return BY_METRIC[obj.metric].alert


class AlertEventSerializer(serializers.ModelSerializer):
    metric = serializers.CharField(source="alert.metric", read_only=True)
    subject = serializers.CharField(source="alert.subject", read_only=True)
    severity = serializers.CharField(source="alert.severity", read_only=True)
    summary = serializers.CharField(source="alert.summary", read_only=True)

    class Meta:
        model = AlertEvent
        fields = [
            "id",
            "alert",
            "at",
            "kind",
            "value",
            "actor",
            "actor_name",
            "metric",
            "subject",
            "severity",
            "summary",
        ]
        read_only_fields = fields


class AlertNotificationSerializer(serializers.ModelSerializer):
    class Meta:
        model = AlertNotification
        fields = [
            "id",
            "transition",
            "text",
            "status",
            "attempts",
            "next_attempt_at",
            "last_error",
            "sent_at",
        ]
        read_only_fields = fields


class AlertDetailSerializer(AlertSerializer):
    events = AlertEventSerializer(many=True, read_only=True)
    notifications = AlertNotificationSerializer(many=True, read_only=True)

    class Meta(AlertSerializer.Meta):
        fields = [*AlertSerializer.Meta.fields, "events", "notifications"]
        read_only_fields = fields


class AlertSummarySerializer(serializers.Serializer):
    firing = serializers.IntegerField(help_text="Alerts firing now (the header badge).")
    unacknowledged = serializers.IntegerField(help_text="Firing alerts nobody acknowledged yet.")
    pending = serializers.IntegerField(help_text="Conditions that hold but not yet for their for-duration.")
    webhook_configured = serializers.BooleanField()


class FleetHealthQuerySerializer(StrictSerializerMixin, serializers.Serializer):
    window = serializers.ChoiceField(
        choices=list(request_health.WINDOWS),
        default=request_health.DEFAULT_WINDOW,
        help_text="The window ending now: 5m, 15m, 1h (default), 6h or 24h.",
    )
    hosts = serializers.IntegerField(
        min_value=1,
        max_value=health.HOSTS_MAX,
        default=health.HOSTS_DEFAULT,
        help_text="How many hosts down to name (the first by name); `count` has them all.",
    )


class HealthFiguresSerializer(serializers.Serializer):
    """Request figures over the window (its part already rolled up): shares of all requests, percentiles
    from the rollups' histograms (within 19%); null where there were no requests (or no streamed ones, for
    TTFT)."""

    requests = serializers.IntegerField()
    errors_4xx = serializers.IntegerField()
    errors_5xx = serializers.IntegerField()
    requests_per_s = serializers.FloatField()
    error_rate = serializers.FloatField(allow_null=True, help_text="Share of requests not answered 2xx.")
    error_rate_4xx = serializers.FloatField(allow_null=True)
    error_rate_5xx = serializers.FloatField(allow_null=True)
    latency_p50_ms = serializers.FloatField(allow_null=True)
    latency_p99_ms = serializers.FloatField(allow_null=True)
    ttft_p50_ms = serializers.FloatField(allow_null=True)
    ttft_p99_ms = serializers.FloatField(allow_null=True)


class PoolHealthSerializer(HealthFiguresSerializer):
    name = serializers.CharField(
        help_text="The route pool (an alias without a policy is a pool of its name)."
    )


class HealthAlertSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    state = serializers.ChoiceField(choices=AlertState.choices)
    severity = serializers.ChoiceField(choices=Severity.choices)
    started_at = serializers.DateTimeField()
    fired_at = serializers.DateTimeField(allow_null=True)


class HealthDownHostSerializer(serializers.Serializer):
    name = serializers.CharField()
    last_heartbeat = serializers.DateTimeField(allow_null=True)
    alert = HealthAlertSerializer(
        allow_null=True,
        help_text="Its InferchainHostDown alert: the open one, else the latest; null before the evaluator "
        "saw it down.",
    )


class HealthHostsDownSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    hosts = HealthDownHostSerializer(many=True)


class HealthThresholdsSerializer(serializers.Serializer):
    error_rate_warn = serializers.FloatField()
    error_rate_critical = serializers.FloatField(
        help_text="The fleet-wide InferchainHigh5xxRatio threshold: where the alert would fire."
    )


class FleetHealthSerializer(serializers.Serializer):
    window = serializers.CharField()
    resolution_s = serializers.IntegerField(help_text="Seconds per point of `series`: 10 or 60.")
    start = serializers.FloatField(help_text="Start of the window, unix seconds.")
    end = serializers.FloatField(help_text="End of the window, unix seconds.")
    known_until = serializers.FloatField(
        help_text="End of the last bucket rolled up (the rollup lags the proxy by about 20 s); the "
        "figures cover the window up to here."
    )
    t = serializers.ListField(child=serializers.FloatField(), help_text="Bucket starts, unix seconds.")
    fleet = HealthFiguresSerializer(help_text="All pools together.")
    series = serializers.DictField(
        child=serializers.ListField(child=serializers.FloatField(allow_null=True)),
        help_text="The fleet's figures per bucket of `t` (null: not rolled up yet, or no requests): "
        + ", ".join(request_health.FIELDS)
        + ".",
    )
    pools = PoolHealthSerializer(many=True, help_text="Busiest first; configured pools without traffic too.")
    hosts_down = HealthHostsDownSerializer()
    thresholds = HealthThresholdsSerializer()
