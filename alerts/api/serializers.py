"""Serializers of the alerts API: rules (with their catalogue entry), alerts, their history."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from alerts.choices import Metric
from alerts.models import Alert, AlertEvent, AlertNotification, AlertRule
from alerts.rules import BY_METRIC, MAX_FOR_SECONDS
from alerts.services import RuleError, validate_rule
from core.api.base import StrictModelSerializer


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
