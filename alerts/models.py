"""Alert rules (fleet defaults and per-deployment or per-pool overrides), alerts with their history,
and the webhook messages owed for each state change."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from alerts.choices import AlertState, DeliveryStatus, EventKind, Metric, Severity, Transition


class AlertRule(models.Model):
    """One rule's threshold, for-duration and switch: fleet-wide (no scope), or for one deployment or pool.

    The most specific row applies: deployment, then pool (the pools whose deployments serve its alias),
    then fleet-wide. The fleet-wide rows start at alerts.rules' defaults (the Prometheus rules file's).
    """

    metric = models.CharField(max_length=40, choices=Metric.choices)
    deployment = models.ForeignKey(
        "nodes.Deployment", null=True, blank=True, on_delete=models.CASCADE, related_name="alert_rules"
    )
    pool = models.ForeignKey(
        "routing.RoutePool", null=True, blank=True, on_delete=models.CASCADE, related_name="alert_rules"
    )
    threshold = models.FloatField(null=True, blank=True)
    for_seconds = models.PositiveIntegerField()
    enabled = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["metric", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["metric"],
                condition=Q(deployment__isnull=True, pool__isnull=True),
                name="alert_rule_one_fleet_row",
            ),
            models.UniqueConstraint(
                fields=["metric", "deployment"],
                condition=Q(deployment__isnull=False),
                name="alert_rule_one_per_deployment",
            ),
            models.UniqueConstraint(
                fields=["metric", "pool"], condition=Q(pool__isnull=False), name="alert_rule_one_per_pool"
            ),
            models.CheckConstraint(
                condition=Q(deployment__isnull=True) | Q(pool__isnull=True), name="alert_rule_one_scope"
            ),
        ]

    def __str__(self) -> str:
        target = self.deployment or self.pool or "fleet"
        return f"{self.metric} ({target})"

    @property
    def scope(self) -> str:
        if self.deployment_id:
            return "deployment"
        if self.pool_id:
            return "pool"
        return "fleet"


class Alert(models.Model):
    """One episode of one condition on one subject: pending, then firing, then resolved.

    `fingerprint` names the condition and its subject (`engine_down:deployment=sim-0`); at most one
    alert per fingerprint is open (pending or firing), so a re-run of the evaluator cannot open a twin.
    A pending alert whose condition clears before its for-duration is deleted: it never paged anyone.
    """

    metric = models.CharField(max_length=40, choices=Metric.choices)
    fingerprint = models.CharField(max_length=300)
    subject = models.CharField(max_length=300)
    labels = models.JSONField(default=dict, blank=True)
    severity = models.CharField(max_length=16, choices=Severity.choices)
    state = models.CharField(max_length=16, choices=AlertState.choices, default=AlertState.PENDING)
    summary = models.CharField(max_length=500)
    value = models.FloatField(null=True, blank=True)
    threshold = models.FloatField(null=True, blank=True)
    for_seconds = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now)
    fired_at = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    acknowledged_by_name = models.CharField(max_length=150, blank=True, default="")
    acknowledged_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["fingerprint"],
                condition=Q(state__in=[AlertState.PENDING, AlertState.FIRING]),
                name="alert_one_open_per_fingerprint",
            ),
        ]
        indexes = [models.Index(fields=["state", "-started_at"], name="alert_state_started")]

    def __str__(self) -> str:
        return f"{self.metric}: {self.subject} ({self.state})"


class AlertEvent(models.Model):
    """The history: every state change of an alert, and every acknowledgement (who, when)."""

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(default=timezone.now)
    kind = models.CharField(max_length=16, choices=EventKind.choices)
    value = models.FloatField(null=True, blank=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.kind} at {self.at.isoformat()}"


class AlertNotification(models.Model):
    """A webhook message owed for one state change of one alert: one row per (alert, transition), so
    the message is sent once however often the evaluator or the delivery task runs."""

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="notifications")
    transition = models.CharField(max_length=16, choices=Transition.choices)
    text = models.TextField()
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    last_error = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["alert", "transition"], name="alert_notification_once"),
        ]
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="alert_notification_due")]

    def __str__(self) -> str:
        return f"{self.transition} message ({self.status})"
