"""The beat evaluator on fabricated samples (real PostgreSQL and Redis): pending for the rule's
for-duration, then firing once, no twin or second message while it still fires, resolved when the
condition clears; overrides per deployment and pool; the range conditions over their windows."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from alerts import samples
from alerts.choices import AlertState, EventKind, Metric, Transition
from alerts.models import Alert, AlertEvent, AlertNotification, AlertRule
from alerts.services import evaluate
from console.models import Quota, Tenant
from core.redis_client import get_redis, key
from nodes.choices import DeploymentState
from nodes.lifecycle import live_deployment_key
from nodes.models import Deployment, Host
from routing.models import RequestLog, RoutePool
from routing.proxy.limits import budget_key, tenant_scope
from tests.alerts.conftest import T0, at, heartbeat, publish_engine, publish_gpu

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def webhook(settings: Any, redis_clean: None) -> None:
    # Messages are owed only with a URL; nothing is sent here (tests/alerts/test_webhook.py sends).
    settings.ALERT_WEBHOOK_URL = "http://127.0.0.1:9/hook"


def run(host: Host, t: float) -> Any:
    heartbeat(host, t)
    return evaluate(now=t)


def open_alerts(metric: str) -> list[Alert]:
    return list(Alert.objects.filter(metric=metric).exclude(state=AlertState.RESOLVED))


def test_engine_down_fires_after_for_once_and_resolves(alert_host: Host, make_engine: Any) -> None:
    engine: Deployment = make_engine(state=DeploymentState.CRASHED)

    first = run(alert_host, T0)
    (alert,) = open_alerts(Metric.ENGINE_DOWN)
    assert alert.state == AlertState.PENDING and first.pending == [alert.pk] and not first.fired
    assert alert.labels == {"deployment": engine.name, "alias": "llama-3.1-8b", "host": alert_host.name}

    # Still inside the rule's 2 minutes: pending, no message.
    assert run(alert_host, T0 + 119).fired == []
    assert AlertNotification.objects.count() == 0

    fired = run(alert_host, T0 + 121)
    alert.refresh_from_db()
    assert fired.fired == [alert.pk] and alert.state == AlertState.FIRING
    assert alert.fired_at == at(T0 + 121)
    assert "Engine eng-0 on alert-node is down" in alert.summary

    # Still firing, evaluated again (and a re-run of the same tick): no twin, no new event or message.
    for t in (T0 + 150, T0 + 150, T0 + 300):
        again = run(alert_host, t)
        assert again.fired == [] and again.pending == [] and again.notifications == []
    assert Alert.objects.filter(metric=Metric.ENGINE_DOWN).count() == 1
    alert.refresh_from_db()
    assert alert.last_seen_at == at(T0 + 300)

    # The engine recovers: resolved once, one message each way.
    Deployment.objects.filter(pk=engine.pk).update(state=DeploymentState.READY)
    publish_engine(engine)
    resolved = run(alert_host, T0 + 330)
    alert.refresh_from_db()
    assert resolved.resolved == [alert.pk] and alert.state == AlertState.RESOLVED
    assert alert.resolved_at == at(T0 + 330)
    assert run(alert_host, T0 + 360).resolved == []
    kinds = list(alert.events.order_by("at", "id").values_list("kind", flat=True))
    assert kinds == [EventKind.PENDING, EventKind.FIRING, EventKind.RESOLVED]
    sent = list(AlertNotification.objects.order_by("id").values_list("transition", "text"))
    assert [t for t, _ in sent] == [Transition.FIRING, Transition.RESOLVED]
    assert sent[0][1].startswith("[FIRING] [critical] InferchainEngineDown: Engine eng-0")
    assert sent[1][1].startswith("[RESOLVED] InferchainEngineDown")

    # Down again later: a new episode, a new alert row, a new firing message.
    Deployment.objects.filter(pk=engine.pk).update(state=DeploymentState.CRASHED)
    get_redis().delete(live_deployment_key(engine.pk))
    run(alert_host, T0 + 400)
    run(alert_host, T0 + 530)
    assert Alert.objects.filter(metric=Metric.ENGINE_DOWN).count() == 2
    assert AlertNotification.objects.count() == 3


def test_a_pending_alert_that_clears_leaves_nothing(alert_host: Host, make_engine: Any) -> None:
    engine = make_engine(state=DeploymentState.STARTING)
    run(alert_host, T0)
    assert len(open_alerts(Metric.ENGINE_DOWN)) == 1
    Deployment.objects.filter(pk=engine.pk).update(state=DeploymentState.READY)
    publish_engine(engine)
    result = run(alert_host, T0 + 30)
    assert len(result.dropped) == 1
    assert not Alert.objects.exists() and not AlertEvent.objects.exists()
    assert not AlertNotification.objects.exists()


def test_disabling_a_rule_resolves_its_alerts(alert_host: Host, make_engine: Any) -> None:
    make_engine(state=DeploymentState.FAILED)
    run(alert_host, T0)
    run(alert_host, T0 + 200)
    assert open_alerts(Metric.ENGINE_DOWN)[0].state == AlertState.FIRING
    AlertRule.objects.filter(metric=Metric.ENGINE_DOWN, deployment=None, pool=None).update(enabled=False)
    assert len(run(alert_host, T0 + 215).resolved) == 1


def test_gpu_rules_and_host_down(alert_host: Host) -> None:
    publish_gpu(alert_host, 0, temperature_c=91.0, memory_used_bytes=79 * 1024**3)
    run(alert_host, T0)
    fired = run(alert_host, T0 + 301)
    alerts = {a.metric: a for a in Alert.objects.filter(pk__in=fired.fired)}
    assert set(alerts) == {Metric.GPU_TEMPERATURE_HIGH, Metric.GPU_MEMORY_HIGH}
    assert alerts[Metric.GPU_TEMPERATURE_HIGH].value == 91.0
    assert alerts[Metric.GPU_MEMORY_HIGH].value == pytest.approx(79 / 80)
    assert alerts[Metric.GPU_TEMPERATURE_HIGH].labels == {"host": "alert-node", "gpu": "0"}

    # The agent stops: no heartbeat for over a minute fires host_down (after its 1 m).
    evaluate(now=T0 + 400)
    assert open_alerts(Metric.HOST_DOWN)[0].state == AlertState.PENDING
    evaluate(now=T0 + 461)
    assert open_alerts(Metric.HOST_DOWN)[0].state == AlertState.FIRING


def test_kv_override_per_deployment_and_pool(alert_host: Host, make_engine: Any) -> None:
    a, b, c = make_engine(), make_engine(), make_engine(served_model_name="other")
    for engine in (a, b, c):
        publish_engine(engine, kv_cache_usage_perc=0.6)
    pool = RoutePool.objects.create(name="other-pool", alias="other")
    AlertRule.objects.create(metric=Metric.KV_CACHE_SATURATED, deployment=a, threshold=0.5, for_seconds=0)
    AlertRule.objects.create(metric=Metric.KV_CACHE_SATURATED, pool=pool, threshold=0.55, for_seconds=60)
    run(alert_host, T0)
    kv = {x.labels["deployment"]: x.state for x in open_alerts(Metric.KV_CACHE_SATURATED)}
    # a: its own rule fires at once; c: its pool's rule, pending for 60 s; b: the fleet's 0.95, nothing.
    assert kv == {a.name: AlertState.FIRING, c.name: AlertState.PENDING}
    run(alert_host, T0 + 61)
    assert {x.state for x in open_alerts(Metric.KV_CACHE_SATURATED)} == {AlertState.FIRING}


def test_crash_looping_counts_restarts_over_15_minutes(alert_host: Host, make_engine: Any) -> None:
    engine = make_engine(restarts_total=5)
    publish_engine(engine)
    run(alert_host, T0)
    Deployment.objects.filter(pk=engine.pk).update(restarts_total=7)
    publish_engine(engine)
    assert run(alert_host, T0 + 60).fired == []  # 2 restarts in the window: under 3
    Deployment.objects.filter(pk=engine.pk).update(restarts_total=8)
    result = run(alert_host, T0 + 120)
    (alert,) = Alert.objects.filter(pk__in=result.fired)
    assert alert.metric == Metric.ENGINE_CRASH_LOOPING and alert.value == 3.0
    # Fifteen quiet minutes later the first samples have left the window: resolved.
    run(alert_host, T0 + 120 + 15 * 60 + 1)
    alert.refresh_from_db()
    assert alert.state == AlertState.RESOLVED


def test_queue_growing_needs_the_queue_to_grow(alert_host: Host, make_engine: Any) -> None:
    engine = make_engine()
    for n, waiting in enumerate((12, 12, 12)):
        publish_engine(engine, num_requests_waiting=waiting)
        run(alert_host, T0 + 15 * n)
    assert open_alerts(Metric.QUEUE_GROWING) == []  # above 10 but flat
    for n, waiting in enumerate((14, 16, 18), start=3):
        publish_engine(engine, num_requests_waiting=waiting)
        run(alert_host, T0 + 15 * n)
    (alert,) = open_alerts(Metric.QUEUE_GROWING)
    assert alert.state == AlertState.PENDING and alert.value == 18


def test_ttft_over_twice_its_baseline(alert_host: Host, make_engine: Any) -> None:
    engine = make_engine()
    # Yesterday's samples (hourly means of 0.3 s), then a p95 of 0.9 s now.
    for hours_ago in range(2, 20):
        samples.record_baselines({str(engine.pk): 0.3}, T0 - hours_ago * 3600, 3600, 86400)
    publish_engine(engine, ttft_p95_s=0.9)
    run(alert_host, T0)
    (alert,) = open_alerts(Metric.TTFT_P95_OVER_BASELINE)
    assert alert.value == 0.9 and "baseline 0.30 s" in alert.summary
    # 0.5 s is under the floor however low the baseline: nothing.
    publish_engine(engine, ttft_p95_s=0.5)
    run(alert_host, T0 + 15)
    assert open_alerts(Metric.TTFT_P95_OVER_BASELINE) == []


def test_5xx_ratio_per_alias_with_a_pool_override(alert_host: Host) -> None:
    now = at(T0)
    rows = [RequestLog(created_at=now - dt.timedelta(seconds=30), alias="a", status=200) for _ in range(18)]
    rows += [RequestLog(created_at=now - dt.timedelta(seconds=30), alias="a", status=502) for _ in range(2)]
    rows += [RequestLog(created_at=now - dt.timedelta(seconds=30), alias="b", status=503) for _ in range(1)]
    rows += [RequestLog(created_at=now - dt.timedelta(seconds=30), alias="b", status=200) for _ in range(3)]
    # Older than the 5-minute window: not counted.
    rows += [RequestLog(created_at=now - dt.timedelta(minutes=6), alias="a", status=500) for _ in range(50)]
    RequestLog.objects.bulk_create(rows)
    pool = RoutePool.objects.create(name="b-pool", alias="b")
    AlertRule.objects.create(metric=Metric.HIGH_5XX_RATIO, pool=pool, threshold=0.3, for_seconds=300)
    run(alert_host, T0)
    values = {x.labels["alias"]: x.value for x in open_alerts(Metric.HIGH_5XX_RATIO)}
    assert values == {"a": pytest.approx(0.1)}  # b: 25% is under its pool's 30%


def test_tenant_near_budget_fires_at_once(alert_host: Host) -> None:
    tenant = Tenant.objects.create(name="acme")
    Quota.objects.create(tenant=tenant, daily_token_budget=1000)
    day = at(T0).strftime("%Y%m%d")
    get_redis().set(budget_key(tenant_scope(tenant.pk), day), 950)
    result = run(alert_host, T0)
    (alert,) = Alert.objects.filter(pk__in=result.fired)
    assert alert.metric == Metric.TENANT_NEAR_BUDGET and alert.severity == "info"
    assert alert.summary == "Tenant acme used 95.0% of its daily token budget"
    # No for-duration: fired at once, with no pending step in its history.
    assert result.pending == []
    assert list(alert.events.values_list("kind", flat=True)) == [EventKind.FIRING]


def test_an_overlapping_run_is_skipped(alert_host: Host, make_engine: Any) -> None:
    make_engine(state=DeploymentState.FAILED)
    get_redis().set(key("alerts", "evaluate", "lock"), "another-run", ex=60)
    assert run(alert_host, T0).skipped
    assert not Alert.objects.exists()
    # The other run's lock is left alone; once it is gone, evaluation goes on.
    assert get_redis().get(key("alerts", "evaluate", "lock")) == b"another-run"
    get_redis().delete(key("alerts", "evaluate", "lock"))
    assert len(run(alert_host, T0).pending) == 1
