"""The evaluator's writes in bulk (alerts/services.py `_apply`) and its Redis series in scripts
(alerts/samples.py): what they store is what the one-row-at-a-time code stored."""

from __future__ import annotations

from typing import Any

import pytest

from alerts import samples
from alerts.choices import AlertState, EventKind, Metric
from alerts.models import Alert, AlertEvent, AlertRule
from alerts.services import evaluate
from core.redis_client import get_redis
from nodes.models import Deployment, Host
from tests.alerts.conftest import T0, at, heartbeat, publish_engine

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _redis(redis_clean: None) -> None:
    return None


def run(host: Host, t: float) -> Any:
    heartbeat(host, t)
    return evaluate(now=t)


def kv_alerts() -> dict[str, Alert]:
    return {
        a.labels["deployment"]: a
        for a in Alert.objects.filter(metric=Metric.KV_CACHE_SATURATED).exclude(state=AlertState.RESOLVED)
    }


def test_a_steady_alerts_new_value_and_rule_are_stored(alert_host: Host, make_engine: Any) -> None:
    engines: list[Deployment] = [make_engine() for _ in range(3)]
    for engine in engines:
        publish_engine(engine, kv_cache_usage_perc=0.97)
    first = run(alert_host, T0)
    assert len(first.pending) == 3
    assert AlertEvent.objects.filter(kind=EventKind.PENDING).count() == 3

    # One engine's value moves, the others hold: one statement writes the new value and summary.
    publish_engine(engines[0], kv_cache_usage_perc=0.99)
    run(alert_host, T0 + 15)
    alerts = kv_alerts()
    changed, steady = alerts[engines[0].name], alerts[engines[1].name]
    assert changed.value == 0.99 and changed.summary == f"KV cache of {engines[0].name} at 99.0%"
    assert steady.value == 0.97 and steady.summary.endswith("at 97.0%")
    assert {a.last_seen_at for a in alerts.values()} == {at(T0 + 15)}
    assert {a.started_at for a in alerts.values()} == {at(T0)}

    # The fleet rule's threshold and for-duration change: every open alert carries the new rule.
    AlertRule.objects.filter(metric=Metric.KV_CACHE_SATURATED, deployment=None, pool=None).update(
        threshold=0.96, for_seconds=600
    )
    run(alert_host, T0 + 30)
    assert {(a.threshold, a.for_seconds, a.state) for a in kv_alerts().values()} == {
        (0.96, 600, AlertState.PENDING)
    }

    # Past the new for-duration: all three fire in the same run, each with one firing event.
    fired = run(alert_host, T0 + 601)
    alerts = kv_alerts()
    assert sorted(fired.fired) == sorted(a.pk for a in alerts.values())
    assert {(a.state, a.fired_at, a.last_seen_at) for a in alerts.values()} == {
        (AlertState.FIRING, at(T0 + 601), at(T0 + 601))
    }
    assert AlertEvent.objects.filter(kind=EventKind.FIRING).count() == 3

    # Two clear: resolved together, each with its resolved event and its last value.
    for engine in engines[:2]:
        publish_engine(engine, kv_cache_usage_perc=0.5)
    result = run(alert_host, T0 + 616)
    assert len(result.resolved) == 2
    resolved = Alert.objects.filter(pk__in=result.resolved)
    assert {(a.state, a.resolved_at) for a in resolved} == {(AlertState.RESOLVED, at(T0 + 616))}
    events = AlertEvent.objects.filter(kind=EventKind.RESOLVED)
    assert sorted(float(e.value or 0) for e in events) == [0.97, 0.99]


def test_windows_return_the_same_ends_as_the_whole_window() -> None:
    values = [3.0, 5.0, 4.0, 9.0]
    for n, v in enumerate(values):
        samples.record_windows("t", {"a": v, "b": v * 2}, 1000.0 + 10 * n, 25.0)
    # A re-run at the same time with another value: two samples at one time, ordered by value.
    full = samples.record_windows("t", {"a": 7.0, "b": 1.0}, 1030.0, 25.0)
    ends = samples.record_windows("t", {"a": 7.0, "b": 1.0}, 1030.0, 25.0, full=("b",))
    assert full["a"] == [(1010.0, 5.0), (1020.0, 4.0), (1030.0, 7.0), (1030.0, 9.0)]
    assert ends["a"][0] == full["a"][0] and ends["a"][-1] == full["a"][-1]
    assert ends["b"] == full["b"]  # asked for in full
    assert get_redis().ttl(samples.window_key("t", "a")) == 25 * 2 + 60


def test_baselines_read_only_what_is_wanted_and_drop_old_hours() -> None:
    hour = samples.HOUR
    now = 500 * hour + 10.0
    skip, span = hour, 4 * hour
    for h in range(2, 8):
        samples.record_baselines({"a": 0.2 * h, "b": 1.0}, now - h * hour, skip, span)
    both = samples.record_baselines({"a": 0.1, "b": 1.0}, now, skip, span)
    # Hours 496..498 lie wholly in [now - 5 h, now - 1 h]: a's values there were 0.8, 0.6, 0.4.
    assert both["a"] == pytest.approx((0.8 + 0.6 + 0.4) / 3) and both["b"] == 1.0
    only_a = samples.record_baselines({"a": 0.1, "b": 1.0}, now + 1, skip, span, wanted={"a"})
    assert only_a["a"] == both["a"] and only_a["b"] is None
    # Hours before the kept one (495 here: 493 and 494 go) are dropped once the kept hour moves.
    fields = {f.decode() if isinstance(f, bytes) else f for f in get_redis().hkeys(samples.baseline_key("a"))}
    assert {int(f.split(":")[0]) for f in fields} == {495, 496, 497, 498, 500}
    samples.record_baselines({"a": 0.1}, now + 3 * hour, skip, span, wanted=())
    fields = {f.decode() if isinstance(f, bytes) else f for f in get_redis().hkeys(samples.baseline_key("a"))}
    assert {int(f.split(":")[0]) for f in fields} == {498, 500, 503}
