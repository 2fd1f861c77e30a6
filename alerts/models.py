"""Alert rules (fleet defaults and per-deployment or per-pool overrides), alerts with their history,
and the webhook messages owed for each state change."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.query import ModelIterable
from django.utils import timezone

from alerts.choices import OPEN_STATES, AlertState, DeliveryStatus, EventKind, Metric, Severity, Transition


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


class Evaluation(models.Model):
    """The evaluator's last run (one row, pk 1), written in the transaction of the run's state changes.

    Every alert a run leaves open held at that run (one that no longer holds is resolved or dropped by
    it), so an open alert was last seen when the evaluator last ran: its `last_seen_at` is read from
    here (Alert's queryset) instead of being rewritten on each of its rows every run. At 1,000 hosts
    that rewrite was ~1,300 rows every 15 s, the run's costliest statement (27-47 ms on the shared
    2-core VM, benchmarks/alert_evaluation.py), and as many dead row versions for autovacuum.
    """

    ran_at = models.DateTimeField()

    ONE = 1

    def __str__(self) -> str:
        return f"alerts evaluated at {self.ran_at.isoformat()}"


def last_evaluated_at(using: str | None = None) -> dt.datetime | None:
    """When the evaluator last ran (None before its first run)."""
    return Evaluation.objects.using(using).filter(pk=Evaluation.ONE).values_list("ran_at", flat=True).first()


def _loads(queryset: models.QuerySet[Any], name: str) -> bool:
    """Whether the queryset's rows carry the field `name` (not deferred by `defer` or `only`)."""
    names, defer = queryset.query.deferred_loading
    return name not in names if defer else name in names


class _SeenIterable(ModelIterable):
    """Alerts as stored, an open one's last_seen_at brought up to the evaluator's last run.

    The run's time is read before the rows: a run that commits in between then shows its alerts one run
    stale, never seen by a run that resolved them. The later of the two stays, for a row opened after the
    last run (by hand) or last seen before the evaluator kept its time here."""

    def __iter__(self) -> Iterator[Any]:
        queryset = self.queryset
        ran_at = last_evaluated_at(queryset.db) if _loads(queryset, "last_seen_at") else None
        for alert in super().__iter__():
            if ran_at is not None and alert.state in OPEN_STATES and ran_at > alert.last_seen_at:
                alert.last_seen_at = ran_at
            yield alert


class AlertQuerySet(models.QuerySet["Alert"]):
    """Alert instances with their last_seen_at as the evaluator left it (`_SeenIterable`). What does not
    build them here reads the column as stored, which for an open alert is when its row was written:
    `values()`, `values_list()`, a filter or ordering on it, and an alert built by another model's
    `select_related` (AlertEvent's API shows none of its alert's times)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._iterable_class = _SeenIterable


class Alert(models.Model):
    """One episode of one condition on one subject: pending, then firing, then resolved.

    `fingerprint` names the condition and its subject (`engine_down:deployment=sim-0`); at most one
    alert per fingerprint is open (pending or firing), so a re-run of the evaluator cannot open a twin.
    A pending alert whose condition clears before its for-duration is deleted: it never paged anyone.

    `last_seen_at` is the last evaluation at which the condition held. Stored as the row's opening time
    and, when it is resolved, the run before; while it is open the evaluator's last run stands for it
    (`Evaluation`), so its instances (every queryset, refresh_from_db, a relation's access: this is
    also the base manager) carry the later of the two.
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

    objects = AlertQuerySet.as_manager()

    class Meta:
        base_manager_name = "objects"
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
