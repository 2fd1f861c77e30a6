"""The evaluator's writes in bulk (alerts/services.py `_apply`) and its Redis series in scripts
(alerts/samples.py): what they store is what the one-row-at-a-time code stored."""

from __future__ import annotations

import gc
from typing import Any, cast

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils.dateparse import parse_datetime
from rest_framework.test import APIClient

from alerts import samples, services
from alerts.choices import AlertState, EventKind, Metric
from alerts.models import Alert, AlertEvent, AlertRule
from alerts.services import evaluate
from core.redis_client import get_redis
from core.redis_client import key as get_redis_key
from nodes.choices import DeploymentState
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
    # One snapshot a run, indexed by time: the run at 1000 has left the 25 s window, each one expires.
    redis = get_redis()
    members = [m.decode() for m in cast(list[bytes], redis.zrange(samples.snapshot_index_key("t"), 0, -1))]
    assert sorted(float(m.split(":")[0]) for m in members) == [1010.0, 1020.0, 1030.0, 1030.0, 1030.0]
    assert {redis.ttl(samples.snapshot_key("t", m)) for m in members} == {25 * 2 + 60}


def test_ends_come_from_the_oldest_snapshot_that_holds_the_subject() -> None:
    """A subject that joined the series late (a new engine) starts its window at its own first sample;
    one absent from a run (no live record then) has no sample there."""
    samples.record_windows("r", {"old": 1.0}, 100.0, 60.0)
    samples.record_windows("r", {"old": 2.0, "new": 5.0}, 115.0, 60.0)
    samples.record_windows("r", {"new": 6.0}, 130.0, 60.0)
    ends = samples.record_windows("r", {"old": 4.0, "new": 9.0}, 145.0, 60.0, full=())
    assert ends == {"old": [(100.0, 1.0), (145.0, 4.0)], "new": [(115.0, 5.0), (145.0, 9.0)]}
    whole = samples.record_windows("r", {"old": 4.0, "new": 9.0}, 165.0, 60.0)
    # 100 has left the window (165 - 60 = 105); old missed the run at 130.
    assert whole["old"] == [(115.0, 2.0), (145.0, 4.0), (165.0, 4.0)]
    assert whole["new"] == [(115.0, 5.0), (130.0, 6.0), (145.0, 9.0), (165.0, 9.0)]


def test_a_run_reads_two_snapshots_however_late_a_subject_joined(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first sample of an engine that joined after the oldest snapshot comes from the previous
    snapshot's record of joins, not from a walk through the window (60 snapshots at 15 min)."""
    asked: list[int] = []
    read = samples._read

    def counting(redis: Any, series: str, listed: list[tuple[str, float]]) -> Any:
        asked.append(len(listed))
        return read(redis, series, listed)

    monkeypatch.setattr(samples, "_read", counting)
    for n in range(30):
        values = {"a": float(n)} | ({"late": 100.0 + n} if n >= 12 else {})
        got = samples.record_windows("r", values, 1000.0 + 15 * n, 900.0, full=())
    assert max(asked) <= 2
    assert got == {"a": [(1000.0, 0.0), (1435.0, 29.0)], "late": [(1180.0, 112.0), (1435.0, 129.0)]}


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
    # Each hour is two hashes (sums, counts) that expire whole once no baseline can reach them.
    redis = get_redis()
    for h in (494, 498, 500):
        sums, counts = samples.baseline_keys(h)
        assert {redis.ttl(sums), redis.ttl(counts)} == {int(skip + span + 2 * hour)}
    assert redis.hget(samples.baseline_keys(500)[1], "a") == b"2"  # the runs at now and now + 1


def test_baselines_kept_per_subject_by_an_earlier_version_are_adopted_once() -> None:
    """An upgrade keeps the engines' day of TTFT: the per-subject hashes of the version before move into
    the hourly ones at the first run, and are gone."""
    hour = samples.HOUR
    now = 500 * hour + 10.0
    redis = get_redis()
    old = get_redis_key("alerts", "baseline", "7")
    redis.hset(old, mapping={"497:s": 1.2, "497:n": 3, "498:s": 0.6, "498:n": 2})
    redis.set(get_redis_key("alerts", "baseline", "pruned"), "495")
    got = samples.record_baselines({"7": 0.1}, now, hour, 4 * hour)
    assert got["7"] == pytest.approx((1.2 + 0.6) / 5)
    assert redis.exists(old) == 0 and redis.exists(get_redis_key("alerts", "baseline", "pruned")) == 0
    # Once: a second run adds nothing more from anywhere.
    assert samples.record_baselines({"7": 0.1}, now + 1, hour, 4 * hour)["7"] == got["7"]


def test_a_steady_alert_is_not_rewritten_yet_every_reader_sees_it_seen_by_the_last_run(
    alert_host: Host, make_engine: Any, viewer_client: APIClient
) -> None:
    """While an alert holds, its row is not written each run: its last-seen time is the evaluator's last
    run (one row, alerts.models.Evaluation), and the API, a queryset and refresh_from_db all show it."""
    engine: Deployment = make_engine(state=DeploymentState.CRASHED)
    run(alert_host, T0)
    (alert,) = Alert.objects.filter(metric=Metric.ENGINE_DOWN)
    for t in (T0 + 15, T0 + 30):
        with CaptureQueriesContext(connection) as ran:
            run(alert_host, t)
        assert not [
            q for q in ran.captured_queries if q["sql"].startswith(f'UPDATE "{Alert._meta.db_table}"')
        ]

        assert parse_datetime(viewer_client.get(f"/api/alerts/{alert.pk}/").json()["last_seen_at"]) == at(t)
        (listed,) = viewer_client.get("/api/alerts/").json()["results"]
        assert parse_datetime(listed["last_seen_at"]) == at(t)
        assert Alert.objects.get(pk=alert.pk).last_seen_at == at(t)
        alert.refresh_from_db()
        assert alert.last_seen_at == at(t)
        # A relation's access reads through the same queryset (the base manager).
        assert AlertEvent.objects.get(alert=alert).alert.last_seen_at == at(t)
    # The column itself still holds the opening run: nothing wrote it since.
    assert Alert.objects.values_list("last_seen_at", flat=True).get(pk=alert.pk) == at(T0)

    # Fired, then the engine recovers: resolved with the last run that saw it down, and that stays.
    run(alert_host, T0 + 120)
    Deployment.objects.filter(pk=engine.pk).update(state=DeploymentState.READY)
    publish_engine(engine)
    assert run(alert_host, T0 + 135).resolved == [alert.pk]
    for t in (T0 + 135, T0 + 150):
        run(alert_host, t)
        alert.refresh_from_db()
        assert (alert.state, alert.last_seen_at) == (AlertState.RESOLVED, at(T0 + 120))
        body = viewer_client.get(f"/api/alerts/{alert.pk}/").json()
        assert parse_datetime(body["last_seen_at"]) == at(T0 + 120)


def test_an_open_alert_written_after_the_last_run_keeps_its_own_time(alert_host: Host) -> None:
    """The later of the row's time and the last run: a row opened since (by hand, or by the version
    before, which wrote every run's time on the row) is not shown as seen earlier than it was."""
    run(alert_host, T0)  # the evaluator's last run: T0
    alert = Alert.objects.create(
        metric=Metric.HOST_DOWN,
        fingerprint="host_down:host=elsewhere",
        subject="host elsewhere",
        severity="critical",
        state=AlertState.FIRING,
        summary="Host elsewhere sends no heartbeat",
        started_at=at(T0 - 600),
        last_seen_at=at(T0 + 5),
    )
    assert Alert.objects.get(pk=alert.pk).last_seen_at == at(T0 + 5)
    # The next run does not see it: resolved, last seen when its row said (later than the run before).
    assert alert.pk in run(alert_host, T0 + 15).resolved
    assert Alert.objects.get(pk=alert.pk).last_seen_at == at(T0 + 5)


def test_an_hours_sum_and_count_are_added_up_exactly_and_expire_together() -> None:
    """The baseline script adds each subject's value to its hour's sum in double precision and writes
    it back without rounding; the count stays a whole number (what HINCRBY and the reads parse)."""
    now = 500 * samples.HOUR + 10.0
    for n, value in enumerate((0.1, 0.2, 1e-9)):
        samples.record_baselines({"a": value, f"only-{n}": 2.5}, now + n, samples.HOUR, 4 * samples.HOUR)
    sums, counts = samples.baseline_keys(500)
    redis = get_redis()
    assert float(cast(bytes, redis.hget(sums, "a"))) == 0.1 + 0.2 + 1e-9
    assert redis.hget(counts, "a") == b"3" and redis.hget(counts, "only-1") == b"1"
    assert redis.hget(sums, "only-2") == b"2.5"
    assert redis.ttl(sums) == redis.ttl(counts) == int(5 * samples.HOUR + 2 * samples.HOUR)


def test_a_run_pauses_the_garbage_collector_and_gives_it_back(
    alert_host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The collector is off while a run reads and decides (its records die by reference count) and on
    again after it, also after a run that failed: a worker left without it would never free a cycle."""
    during: list[bool] = []
    read = services.read_fleet

    def reading(*args: Any, **kwargs: Any) -> Any:
        during.append(gc.isenabled())
        return read(*args, **kwargs)

    monkeypatch.setattr(services, "read_fleet", reading)
    run(alert_host, T0)
    assert during == [False] and gc.isenabled()

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the database went away")

    monkeypatch.setattr(services, "read_fleet", failing)
    with pytest.raises(RuntimeError):
        run(alert_host, T0 + 15)
    assert gc.isenabled()
