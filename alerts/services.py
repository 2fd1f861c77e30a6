"""What the beat task and the API ask of alerts: evaluate the rules, acknowledge, validate rule edits.

The state machine per fingerprint (one condition on one subject):

    condition holds, no open alert            -> new alert, pending (firing at once when for is 0)
    pending and held for the rule's for       -> firing; one webhook message owed
    firing and still holds                    -> stays firing: value and last_seen_at updated, no message
    pending and the condition cleared         -> deleted (it never paged anyone)
    firing and the condition cleared          -> resolved; one webhook message owed

Runs under a Redis lock (one evaluation at a time); the partial unique index on open alerts and the
unique (alert, transition) of notifications keep a re-run from opening a twin or owing a second message.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.db import transaction
from django.utils import timezone

from alerts.choices import OPEN_STATES, AlertState, EventKind, Transition
from alerts.conditions import Observation, RuleBook, observe
from alerts.models import Alert, AlertEvent, AlertNotification, AlertRule
from alerts.rules import BY_METRIC, MAX_FOR_SECONDS, RULES
from console.models import User
from core.audit import record_audit
from core.choices import AuditAction
from core.live import FLEET_GROUP, push_live_event
from core.redis_client import get_redis, key
from routing.fleet_metrics import read_state
from routing.models import RoutePool

log = logging.getLogger(__name__)

LOCK_SECONDS = 120


class RuleError(Exception):
    """A rule edit that cannot be saved; `field` names the JSON field it is about."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class AlertStateError(Exception):
    """An action that does not apply to the alert's state (a 409)."""


def ensure_default_rules() -> None:
    """The fleet-wide row of every rule, at the rules file's defaults; existing rows are left as edited."""
    have = set(AlertRule.objects.filter(deployment=None, pool=None).values_list("metric", flat=True))
    missing = [
        AlertRule(metric=r.metric, threshold=r.threshold, for_seconds=r.for_seconds)
        for r in RULES
        if r.metric not in have
    ]
    if missing:
        AlertRule.objects.bulk_create(missing, ignore_conflicts=True)


def validate_rule(metric: str, threshold: Any, for_seconds: Any, scope: str) -> None:
    """Raise RuleError for a value the rule cannot take (the serializer checks types first)."""
    definition = BY_METRIC.get(metric)
    if definition is None:
        raise RuleError("metric", f"Unknown metric {metric!r}; use one of: {', '.join(BY_METRIC)}.")
    if scope != "fleet" and scope not in definition.scopes:
        allowed = " or ".join(definition.scopes) or "nothing narrower than the fleet"
        raise RuleError(scope, f"The {metric} rule applies per {allowed}; it cannot be set per {scope}.")
    if definition.threshold is None:
        if threshold is not None:
            raise RuleError("threshold", f"The {metric} rule has no threshold; leave it null.")
    else:
        if threshold is None:
            raise RuleError("threshold", f"The {metric} rule needs a threshold ({definition.unit}).")
        if threshold < 0:
            raise RuleError("threshold", "Must be 0 or more.")
        if definition.threshold_max is not None and threshold > definition.threshold_max:
            raise RuleError("threshold", f"Must be at most {definition.threshold_max:g} ({definition.unit}).")
    if (
        not isinstance(for_seconds, int)
        or isinstance(for_seconds, bool)
        or not 0 <= for_seconds <= MAX_FOR_SECONDS
    ):
        raise RuleError("for_seconds", f"Must be a whole number of seconds from 0 to {MAX_FOR_SECONDS}.")


@dataclass
class EvaluationResult:
    skipped: bool = False
    observed: int = 0
    pending: list[int] = field(default_factory=list)
    fired: list[int] = field(default_factory=list)
    resolved: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    notifications: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "skipped": self.skipped,
            "observed": self.observed,
            "pending": self.pending,
            "fired": self.fired,
            "resolved": self.resolved,
            "dropped": self.dropped,
            "notifications": self.notifications,
        }


def _lock_key() -> str:
    return key("alerts", "evaluate", "lock")


def message_text(alert: Alert, transition: str) -> str:
    """The webhook's text: Slack renders it as is; other receivers read the same line."""
    name = BY_METRIC[alert.metric].alert
    if transition == Transition.FIRING:
        return f"[FIRING] [{alert.severity}] {name}: {alert.summary}"
    return f"[RESOLVED] {name}: {alert.summary} (resolved)"


def _owe_message(alert: Alert, transition: str, now: Any) -> int | None:
    if not settings.ALERT_WEBHOOK_URL:
        return None
    row, created = AlertNotification.objects.get_or_create(
        alert=alert,
        transition=transition,
        defaults={"text": message_text(alert, transition), "created_at": now, "next_attempt_at": now},
    )
    return row.pk if created else None


def _apply(observations: list[Observation], now_ts: float, result: EvaluationResult) -> None:
    now = dt.datetime.fromtimestamp(now_ts, dt.UTC)
    seen = {o.fingerprint: o for o in observations}
    open_alerts = {a.fingerprint: a for a in Alert.objects.select_for_update().filter(state__in=OPEN_STATES)}

    # Alerts that stay open as they were (the usual case): one UPDATE of their last-seen time, and a
    # row UPDATE only where the value or the rule changed (bulk_update's CASE over every row costs
    # ~0.4 s at 120 alerts on PostgreSQL: benchmarks/alert_evaluation.py).
    steady: list[int] = []
    for fp, obs in seen.items():
        alert = open_alerts.get(fp)
        if alert is None:
            alert = Alert.objects.create(
                metric=obs.metric,
                fingerprint=fp,
                subject=obs.subject[:300],
                labels=obs.labels,
                severity=BY_METRIC[obs.metric].severity,
                state=AlertState.PENDING,
                summary=obs.summary[:500],
                value=obs.value,
                threshold=obs.rule.threshold,
                for_seconds=obs.rule.for_seconds,
                started_at=now,
                last_seen_at=now,
            )
            if obs.rule.for_seconds > 0:  # a rule without a for-duration fires at once: no pending event
                AlertEvent.objects.create(alert=alert, at=now, kind=EventKind.PENDING, value=obs.value)
                result.pending.append(alert.pk)
        else:
            changed = {
                "value": obs.value,
                "summary": obs.summary[:500],
                "threshold": obs.rule.threshold,
                "for_seconds": obs.rule.for_seconds,
            }
            changed = {k: v for k, v in changed.items() if getattr(alert, k) != v}
            for name, value in changed.items():
                setattr(alert, name, value)
            alert.last_seen_at = now
            if changed:
                Alert.objects.filter(pk=alert.pk).update(**changed)
        if (
            alert.state == AlertState.PENDING
            and (now - alert.started_at).total_seconds() >= obs.rule.for_seconds
        ):
            alert.state = AlertState.FIRING
            alert.fired_at = now
            AlertEvent.objects.create(alert=alert, at=now, kind=EventKind.FIRING, value=obs.value)
            result.fired.append(alert.pk)
            owed = _owe_message(alert, Transition.FIRING, now)
            if owed:
                result.notifications.append(owed)
            alert.save()
        elif fp in open_alerts:
            steady.append(alert.pk)
    if steady:
        Alert.objects.filter(pk__in=steady).update(last_seen_at=now)

    for fp, alert in open_alerts.items():
        if fp in seen:
            continue
        if alert.state == AlertState.PENDING:
            result.dropped.append(alert.pk)
            alert.delete()
            continue
        alert.state = AlertState.RESOLVED
        alert.resolved_at = now
        alert.save(update_fields=["state", "resolved_at"])
        AlertEvent.objects.create(alert=alert, at=now, kind=EventKind.RESOLVED, value=alert.value)
        result.resolved.append(alert.pk)
        owed = _owe_message(alert, Transition.RESOLVED, now)
        if owed:
            result.notifications.append(owed)


def evaluate(now: float | None = None) -> EvaluationResult:
    """One evaluation of every rule at `now` (epoch seconds; default the clock)."""
    now = time.time() if now is None else now
    result = EvaluationResult()
    redis = get_redis()
    token = uuid.uuid4().hex
    # Taken before anything is read: with Redis down this raises, and no engine reads as down for want
    # of its live record.
    if not redis.set(_lock_key(), token, nx=True, ex=LOCK_SECONDS):
        result.skipped = True
        return result
    try:
        ensure_default_rules()
        book = RuleBook(AlertRule.objects.all(), RoutePool.objects.all())
        observations = observe(read_state(now), book, now)
        result.observed = len(observations)
        with transaction.atomic():
            _apply(observations, now, result)
    finally:
        # Only our own lock: a run that outlived LOCK_SECONDS must not free the next run's.
        if redis.get(_lock_key()) == token.encode():
            redis.delete(_lock_key())
    if result.fired or result.resolved:
        push_firing_count()
    return result


def firing_count() -> int:
    return Alert.objects.filter(state=AlertState.FIRING).count()


def push_firing_count() -> None:
    """The header badge's number, to every signed-in browser (the fleet group of the live feed)."""
    try:
        push_live_event(FLEET_GROUP, {"type": "alerts", "firing": firing_count()})
    except Exception as exc:  # the badge also polls; a push lost to a Redis hiccup costs a few seconds
        log.warning("could not push the alert count: %s", exc)


def acknowledge(alert: Alert, actor: AbstractBaseUser | AnonymousUser) -> Alert:
    """Mark a firing alert as seen by `actor` (who and when are kept, and audited)."""
    with transaction.atomic():
        alert = Alert.objects.select_for_update().get(pk=alert.pk)
        if alert.state != AlertState.FIRING:
            raise AlertStateError(f"Only a firing alert can be acknowledged; this one is {alert.state}.")
        if alert.acknowledged_at is not None:
            raise AlertStateError(
                f"Already acknowledged by {alert.acknowledged_by_name} "
                f"at {alert.acknowledged_at.isoformat()}."
            )
        user = actor if isinstance(actor, User) and actor.pk else None
        now = timezone.now()
        alert.acknowledged_by = user
        alert.acknowledged_by_name = user.get_username() if user else "system"
        alert.acknowledged_at = now
        alert.save(update_fields=["acknowledged_by", "acknowledged_by_name", "acknowledged_at"])
        AlertEvent.objects.create(
            alert=alert,
            at=now,
            kind=EventKind.ACKNOWLEDGED,
            value=alert.value,
            actor=user,
            actor_name=alert.acknowledged_by_name,
        )
        record_audit(
            actor=actor,
            action=AuditAction.ACTION,
            obj=alert,
            before={"acknowledged_at": None},
            after={
                "action": "acknowledge",
                "acknowledged_at": now.isoformat(),
                "fingerprint": alert.fingerprint,
            },
        )
    return alert
