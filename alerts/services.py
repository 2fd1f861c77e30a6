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
from django.db import connection, models, transaction
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


def _store_changes(changed: list[Alert], now: dt.datetime) -> None:
    """Write the value, summary and rule of every changed alert, and its last-seen time, in one statement
    on PostgreSQL (one UPDATE per alert cost ~0.4 s at 1,300 open alerts: benchmarks/alert_evaluation.py)."""
    if not changed:
        return
    if connection.vendor != "postgresql":
        for alert in changed:
            Alert.objects.filter(pk=alert.pk).update(
                value=alert.value,
                summary=alert.summary,
                threshold=alert.threshold,
                for_seconds=alert.for_seconds,
                last_seen_at=now,
            )
        return
    column = {name: _column(name) for name in _CHANGING}
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Alert._meta.db_table} AS a SET "  # names from the model, values bound
            f"{column['value']} = v.value, {column['summary']} = v.summary, "
            f"{column['threshold']} = v.threshold, {column['for_seconds']} = v.for_seconds, "
            f"{_column('last_seen_at')} = %s "
            "FROM unnest(%s::bigint[], %s::double precision[], %s::text[], %s::double precision[], "
            "%s::integer[]) AS v(id, value, summary, threshold, for_seconds) "
            f"WHERE a.{Alert._meta.pk.column} = v.id",
            [
                now,
                [a.pk for a in changed],
                [a.value for a in changed],
                [a.summary for a in changed],
                [a.threshold for a in changed],
                [a.for_seconds for a in changed],
            ],
        )


def _column(name: str) -> str:
    field = Alert._meta.get_field(name)
    assert isinstance(field, models.Field)
    return str(field.column)


# What an open alert's observation may change (the rest of the row is its episode's).
_CHANGING = ("value", "summary", "threshold", "for_seconds")


def _apply(observations: list[Observation], now_ts: float, result: EvaluationResult) -> None:
    """The state machine of the module docstring, in a fixed number of statements whatever the number of
    alerts: one read of the open alerts, one insert of the new ones and one of their events, one update
    of the changed values, one of the last-seen times, one per transition kind (firing, resolved,
    dropped). Webhook messages are owed one by one, at transitions only."""
    now = dt.datetime.fromtimestamp(now_ts, dt.UTC)
    seen = {o.fingerprint: o for o in observations}
    open_alerts = {
        a.fingerprint: a
        for a in Alert.objects.select_for_update()
        .filter(state__in=OPEN_STATES)
        .only("id", "metric", "fingerprint", "severity", "state", "started_at", *_CHANGING)
    }

    new: list[Alert] = []
    changed: list[Alert] = []  # open, still holding, with a new value, summary or rule
    still_open: list[int] = []  # open and still holding: last seen now
    fires: list[Alert] = []  # open and pending past the rule's for: firing now
    events: list[tuple[Alert, str, float | None]] = []
    # (result list, alert) in observation order: new alerts get their pk from the insert below.
    outcomes: list[tuple[list[int], Alert]] = []
    for fp, obs in seen.items():
        alert = open_alerts.get(fp)
        if alert is None:
            # A rule without a for-duration fires at once (its for has held the moment it starts), with no
            # pending step: no pending event, a firing one.
            at_once = obs.rule.for_seconds <= 0
            alert = Alert(
                metric=obs.metric,
                fingerprint=fp,
                subject=obs.subject[:300],
                labels=obs.labels,
                severity=BY_METRIC[obs.metric].severity,
                state=AlertState.FIRING if at_once else AlertState.PENDING,
                summary=obs.summary[:500],
                value=obs.value,
                threshold=obs.rule.threshold,
                for_seconds=obs.rule.for_seconds,
                started_at=now,
                last_seen_at=now,
                fired_at=now if at_once else None,
            )
            new.append(alert)
            if at_once:
                events.append((alert, EventKind.FIRING, obs.value))
                outcomes.append((result.fired, alert))
            else:
                events.append((alert, EventKind.PENDING, obs.value))
                outcomes.append((result.pending, alert))
            continue
        fresh = {
            "value": obs.value,
            "summary": obs.summary[:500],
            "threshold": obs.rule.threshold,
            "for_seconds": obs.rule.for_seconds,
        }
        if any(getattr(alert, k) != v for k, v in fresh.items()):
            for name, value in fresh.items():
                setattr(alert, name, value)
            changed.append(alert)
        else:
            still_open.append(alert.pk)
        alert.last_seen_at = now
        if (
            alert.state == AlertState.PENDING
            and (now - alert.started_at).total_seconds() >= obs.rule.for_seconds
        ):
            alert.state = AlertState.FIRING
            alert.fired_at = now
            fires.append(alert)
            events.append((alert, EventKind.FIRING, obs.value))
            outcomes.append((result.fired, alert))

    if new:
        Alert.objects.bulk_create(new)
    _store_changes(changed, now)
    if still_open:
        Alert.objects.filter(pk__in=still_open).update(last_seen_at=now)
    if fires:
        Alert.objects.filter(pk__in=[a.pk for a in fires]).update(state=AlertState.FIRING, fired_at=now)
    for into, alert in outcomes:
        into.append(alert.pk)
        if into is result.fired:
            owed = _owe_message(alert, Transition.FIRING, now)
            if owed:
                result.notifications.append(owed)

    dropped: list[int] = []
    resolved: list[Alert] = []
    for fp, alert in open_alerts.items():
        if fp in seen:
            continue
        if alert.state == AlertState.PENDING:
            dropped.append(alert.pk)  # it never paged anyone: gone, with its pending event
        else:
            alert.state = AlertState.RESOLVED
            alert.resolved_at = now
            resolved.append(alert)
            events.append((alert, EventKind.RESOLVED, alert.value))
    if dropped:
        Alert.objects.filter(pk__in=dropped).delete()
        result.dropped.extend(dropped)
    if resolved:
        Alert.objects.filter(pk__in=[a.pk for a in resolved]).update(
            state=AlertState.RESOLVED, resolved_at=now
        )
    if events:
        AlertEvent.objects.bulk_create(
            AlertEvent(alert=alert, at=now, kind=kind, value=value) for alert, kind, value in events
        )
    for alert in resolved:
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
