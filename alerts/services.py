"""What the beat task and the API ask of alerts: evaluate the rules, acknowledge, validate rule edits.

The state machine per fingerprint (one condition on one subject):

    condition holds, no open alert            -> new alert, pending (firing at once when for is 0)
    pending and held for the rule's for       -> firing; one webhook message owed
    firing and still holds                    -> stays firing: value and last_seen_at updated, no message
    pending and the condition cleared         -> deleted (it never paged anyone)
    firing and the condition cleared          -> resolved; one webhook message owed

Runs under a Redis lock (one evaluation at a time), and writes its state changes in one transaction that
holds the evaluator's row (alerts.models.Evaluation), so two runs that overlap past the lock's expiry
still apply one after the other; the partial unique index on open alerts and the unique (alert,
transition) of notifications keep a re-run from opening a twin or owing a second message. That row's
time is every open alert's last_seen_at (the last run saw each of them): a value is written only where
it moved, and an alert that only still holds is not written at all.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.db import connection, models, transaction
from django.db.models import Case, DurationField, ExpressionWrapper, F, Value, When
from django.db.models.functions import Greatest
from django.utils import timezone

from alerts.choices import OPEN_STATES, AlertState, EventKind, Transition
from alerts.conditions import Observation, RuleBook, observe
from alerts.fleet import read_fleet
from alerts.models import Alert, AlertEvent, AlertNotification, AlertRule, Evaluation
from alerts.rules import BY_METRIC, MAX_FOR_SECONDS, RULES
from console.models import User
from core.audit import record_audit
from core.choices import AuditAction
from core.live import FLEET_GROUP, push_live_event
from core.redis_client import get_redis, key
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


# What an open alert's observation may change (the rest of the row is its episode's).
_CHANGING = ("value", "summary", "threshold", "for_seconds")
# What _apply reads of each open alert: the above, and what a transition and its message need.
_OPEN_FIELDS = ("id", "fingerprint", "metric", "severity", "state", *_CHANGING)

Changing = tuple[float | None, str, float | None, int]  # _CHANGING's values, in that order


def _store_changes(changed: list[tuple[int, Changing]]) -> None:
    """Write the value, summary and rule of every changed alert (pk, values) in one statement on
    PostgreSQL (one UPDATE per alert cost ~0.4 s at 1,300 open alerts: benchmarks/alert_evaluation.py)."""
    if not changed:
        return
    if connection.vendor != "postgresql":
        for pk, values in changed:
            Alert.objects.filter(pk=pk).update(**dict(zip(_CHANGING, values, strict=True)))
        return
    column = {name: _column(Alert, name) for name in _CHANGING}
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Alert._meta.db_table} AS a SET "  # names from the model, values bound
            f"{column['value']} = v.value, {column['summary']} = v.summary, "
            f"{column['threshold']} = v.threshold, {column['for_seconds']} = v.for_seconds "
            "FROM unnest(%s::bigint[], %s::double precision[], %s::text[], %s::double precision[], "
            "%s::integer[]) AS v(id, value, summary, threshold, for_seconds) "
            f"WHERE a.{Alert._meta.pk.column} = v.id",
            [[pk for pk, _ in changed], *([v[n] for _, v in changed] for n in range(len(_CHANGING)))],
        )


def _column(model: type[models.Model], name: str) -> str:
    field = model._meta.get_field(name)
    assert isinstance(field, models.Field)
    return str(field.column)


def _take_evaluation(now: dt.datetime) -> dt.datetime | None:
    """The previous run's time (None at the first run), and this run's stored in its place.

    The row stays locked until this run commits: an evaluation that outlived the Redis lock and one
    that took it after that wait here for each other, and the second then reads the first's alerts."""
    before = (
        Evaluation.objects.select_for_update()
        .filter(pk=Evaluation.ONE)
        .values_list("ran_at", flat=True)
        .first()
    )
    if before is None:
        Evaluation.objects.create(pk=Evaluation.ONE, ran_at=now)
    else:
        Evaluation.objects.filter(pk=Evaluation.ONE).update(ran_at=now)
    return before


def _apply(observations: list[Observation], now_ts: float, result: EvaluationResult) -> None:
    """The state machine of the module docstring, in a fixed number of statements whatever the number of
    alerts: one read of the open alerts, one insert of the new ones and one of their events, one update
    of the changed values, one per transition kind (firing, resolved, dropped), one of the evaluator's
    time. Webhook messages are owed one by one, at transitions only.

    An alert that still holds is not written unless its value, summary or rule changed: its last-seen
    time is this run's, which `Evaluation` keeps for every open alert at once (Alert's queryset shows
    it). A resolved one keeps the last run that saw it, written as it resolves."""
    now = dt.datetime.fromtimestamp(now_ts, dt.UTC)
    before = _take_evaluation(now)
    seen = {o.fingerprint: o for o in observations}
    # Tuples, not instances: at 1,300 open alerts building models was most of this read, and only a
    # webhook message needs one (_instance). Of its start, a pending alert's time pending, as the
    # database subtracts it, and a firing one's nothing: a timestamp costs ~5 us to parse (Django's
    # time-zone loader), 7 ms at 1,300 pending alerts, an interval a tenth of that.
    # Not locked (SELECT ... FOR UPDATE): the Evaluation row keeps evaluations apart, and acknowledge
    # writes only its own columns of a row; each update below locks the rows it writes.
    pending_for = ExpressionWrapper(Value(now) - F("started_at"), output_field=DurationField())
    open_alerts = {
        row.fingerprint: row
        for row in Alert.objects.filter(state__in=OPEN_STATES)
        .order_by()
        .annotate(pending_for=Case(When(state=AlertState.PENDING, then=pending_for)))
        .values_list(*_OPEN_FIELDS, "pending_for", named=True)
    }

    new: list[Alert] = []
    changed: list[tuple[int, Changing]] = []  # open, still holding, with a new value, summary or rule
    # Open and pending past the rule's for, firing now: its row and new values, by id.
    fires: dict[int, tuple[Any, Changing]] = {}
    # (the alert, kind, value): a new alert's model (its pk comes from the insert below), else its id.
    events: list[tuple[Alert | int, str, float | None]] = []
    # (result list, alert as in events) in observation order.
    outcomes: list[tuple[list[int], Alert | int]] = []
    for fp, obs in seen.items():
        row = open_alerts.get(fp)
        if row is None:
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
        fresh: Changing = (obs.value, obs.summary[:500], obs.rule.threshold, obs.rule.for_seconds)
        if fresh != (row.value, row.summary, row.threshold, row.for_seconds):
            changed.append((row.id, fresh))
        if row.pending_for is not None and row.pending_for.total_seconds() >= obs.rule.for_seconds:
            fires[row.id] = (row, fresh)
            events.append((row.id, EventKind.FIRING, obs.value))
            outcomes.append((result.fired, row.id))

    if new:
        Alert.objects.bulk_create(new)
    _store_changes(changed)
    if fires:
        Alert.objects.filter(pk__in=list(fires)).update(state=AlertState.FIRING, fired_at=now)
    # A model of an open alert only for a message it owes (~10 us each: 13 ms for 1,300 alerts firing at
    # once, with no webhook to tell).
    messages = bool(settings.ALERT_WEBHOOK_URL)
    for into, which in outcomes:
        pk = which if isinstance(which, int) else which.pk
        into.append(pk)
        if into is result.fired and messages:
            owed = _owe_message(
                which if isinstance(which, Alert) else _instance(*fires[pk]), Transition.FIRING, now
            )
            if owed:
                result.notifications.append(owed)

    dropped: list[int] = []
    resolved: list[Any] = []  # their rows
    for fp, row in open_alerts.items():
        if fp in seen:
            continue
        if row.state == AlertState.PENDING:
            dropped.append(row.id)  # it never paged anyone: gone, with its pending event
        else:
            resolved.append(row)
            events.append((row.id, EventKind.RESOLVED, row.value))
    if dropped:
        Alert.objects.filter(pk__in=dropped).delete()
        result.dropped.extend(dropped)
    if resolved:
        # Last seen by the run before this one: what its readers saw until now, kept from here on.
        seen_last = {} if before is None else {"last_seen_at": Greatest("last_seen_at", Value(before))}
        Alert.objects.filter(pk__in=[row.id for row in resolved]).update(
            state=AlertState.RESOLVED, resolved_at=now, **seen_last
        )
    _store_events([(a if isinstance(a, int) else a.pk, kind, value) for a, kind, value in events], now)
    for row in resolved:
        result.resolved.append(row.id)
        if messages:
            owed = _owe_message(_instance(row), Transition.RESOLVED, now)
            if owed:
                result.notifications.append(owed)


def _store_events(events: list[tuple[int, str, float | None]], at: dt.datetime) -> None:
    """Insert one event per (alert id, kind, value), at `at`: in one statement of arrays on PostgreSQL,
    where bulk_create's models and placeholders took 50-60 ms for 1,300 alerts firing at once (this,
    10-12 ms)."""
    if not events:
        return
    if connection.vendor != "postgresql":
        AlertEvent.objects.bulk_create(
            AlertEvent(alert_id=pk, at=at, kind=kind, value=value) for pk, kind, value in events
        )
        return
    column = {
        name: _column(AlertEvent, name) for name in ("alert", "at", "kind", "value", "actor", "actor_name")
    }
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {AlertEvent._meta.db_table} "  # names from the model, values bound
            f"({column['alert']}, {column['at']}, {column['kind']}, {column['value']}, {column['actor']}, "
            f"{column['actor_name']}) "
            "SELECT v.alert, %s, v.kind, v.value, NULL, '' "
            "FROM unnest(%s::bigint[], %s::text[], %s::double precision[]) AS v(alert, kind, value)",
            [at, *([e[n] for e in events] for n in range(3))],
        )


def _instance(row: Any, fresh: Changing | None = None) -> Alert:
    """An open alert as a model, from its row of _OPEN_FIELDS (with its observation's new values)."""
    alert = Alert(**{name: getattr(row, name) for name in _OPEN_FIELDS})
    if fresh is not None:
        for name, value in zip(_CHANGING, fresh, strict=True):
            setattr(alert, name, value)
    return alert


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block, back on after (unless it was off already).

    A run at 1,000 hosts x 8 GPUs and 5,000 engines allocates some 150,000 container objects (the
    live records as dicts, the rows, the series' tuples) that die by reference count when it ends.
    While they live, the collector passes over them every 700 allocations (and over every survivor
    at each older generation's turn) and finds nothing to free: 15-20 ms of the run, even with the
    worker's imports frozen (core.celery.freeze_heap). A cycle a run leaves is collected after it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _evaluate(now: float, result: EvaluationResult) -> None:
    """The run under the lock. Its own frame, so that the fleet's records it read die with it, while
    the collector is still paused (left for after, they would be its next pass's work)."""
    ensure_default_rules()
    book = RuleBook(AlertRule.objects.all(), RoutePool.objects.all())
    fleet = read_fleet(now, gpus=book.wants_gpus(), tenants=book.wants_tenants())
    observations = observe(fleet, book, now)
    result.observed = len(observations)
    with transaction.atomic():
        _apply(observations, now, result)


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
        with _collector_paused():
            _evaluate(now, result)
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
