"""GET /api/fleet/health/: the dashboard's health figures from known request-log rows rolled up by beat's
own code (28 % errors split 4xx/5xx, known latencies and TTFTs), hosts down named with their alerts in a
fixed number of queries, points written before the 4xx/5xx split still counting their errors, and bad
input refused with JSON field errors."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from alerts.choices import AlertState, Metric, Severity
from alerts.models import Alert
from nodes.choices import HostState
from nodes.models import Host
from routing.models import RequestLog, RoutePool
from routing.rollups import services
from routing.rollups.stats import latency_bucket
from tests.routing.history_helpers import put_point

pytestmark = pytest.mark.django_db


def log(at: float, pool: str, status: int, latency_ms: float, ttft_ms: float | None = None) -> RequestLog:
    return RequestLog(
        created_at=dt.datetime.fromtimestamp(at, dt.UTC),
        alias=pool,
        route_pool=pool,
        status=status,
        stream=ttft_ms is not None,
        prompt_tokens=100,
        completion_tokens=20,
        latency_ms=latency_ms,
        ttft_ms=ttft_ms,
    )


def near(value: float | None, expected: float) -> bool:
    """Within one histogram bucket (2^(1/4), 19 %) of `expected`."""
    return value is not None and expected / 1.19 <= value <= expected * 1.19


def test_health_figures_from_the_request_log(viewer_client: APIClient, redis_clean: None) -> None:
    RoutePool.objects.create(name="chat", alias="chat")
    RoutePool.objects.create(name="idle", alias="idle")  # configured, no traffic: listed with zeros
    bucket = services.bucket_start(time.time(), 10) - 300  # five minutes ago
    rows = (
        # chat: 100 requests, 28 % errors: 8 refused (429), 20 failed upstream (503).
        [log(bucket + 1, "chat", 200, 100.0, ttft_ms=40.0) for _ in range(72)]
        + [log(bucket + 2, "chat", 429, 2.0) for _ in range(8)]
        + [log(bucket + 3, "chat", 503, 1000.0) for _ in range(20)]
        # code (an alias routed as a pool of its name): 10 slow successes.
        + [log(bucket + 4, "code", 200, 2000.0, ttft_ms=400.0) for _ in range(10)]
    )
    RequestLog.objects.bulk_create(rows)
    services.rollup_tick(bucket + services.REQUEST_LAG_SECONDS + 1)  # beat's tick for that bucket

    body = viewer_client.get("/api/fleet/health/", {"window": "15m"}).json()
    assert body["window"] == "15m" and body["resolution_s"] == 10 and len(body["t"]) == 90
    covered = body["known_until"] - body["start"]
    assert 800 <= covered <= 900, covered  # the last half minute is not rolled up yet

    fleet = body["fleet"]
    assert fleet["requests"] == 110 and fleet["errors_4xx"] == 8 and fleet["errors_5xx"] == 20
    assert fleet["error_rate"] == pytest.approx(28 / 110)
    assert fleet["error_rate_4xx"] == pytest.approx(8 / 110)
    assert fleet["error_rate_5xx"] == pytest.approx(20 / 110)
    assert fleet["requests_per_s"] == pytest.approx(110 / covered)
    assert near(fleet["latency_p50_ms"], 100.0) and near(fleet["latency_p99_ms"], 2000.0)
    assert near(fleet["ttft_p50_ms"], 40.0) and near(fleet["ttft_p99_ms"], 400.0)

    pools = {p["name"]: p for p in body["pools"]}
    assert [p["name"] for p in body["pools"]] == ["chat", "code", "idle"]  # busiest first
    chat = pools["chat"]
    assert chat["requests"] == 100 and chat["error_rate"] == pytest.approx(0.28)
    assert chat["error_rate_4xx"] == pytest.approx(0.08) and chat["error_rate_5xx"] == pytest.approx(0.20)
    assert near(chat["latency_p50_ms"], 100.0) and near(chat["latency_p99_ms"], 1000.0)
    assert near(chat["ttft_p99_ms"], 40.0)  # only the streamed answers have a TTFT
    assert pools["code"]["error_rate"] == 0.0 and near(pools["code"]["latency_p50_ms"], 2000.0)
    idle = pools["idle"]
    assert idle["requests"] == 0 and idle["error_rate"] is None and idle["latency_p99_ms"] is None

    # The fleet's series: the bucket's figures at its place on the grid, zero requests around it.
    i = body["t"].index(bucket)
    series = body["series"]
    assert series["requests_per_s"][i] == pytest.approx(11.0)
    assert series["error_rate"][i] == pytest.approx(28 / 110)
    assert series["error_rate_5xx"][i] == pytest.approx(20 / 110)
    assert series["requests_per_s"][i - 1] == 0.0 and series["error_rate"][i - 1] is None
    assert series["requests_per_s"][-1] is None  # not rolled up yet: unknown, not zero
    # Thresholds: the console colours from 1 % and goes red at the alert rule's 5 %.
    assert body["thresholds"] == {"error_rate_warn": 0.01, "error_rate_critical": 0.05}


def test_hosts_down_are_named_with_their_alerts_in_fixed_queries(viewer_client: APIClient) -> None:
    long_ago = timezone.now() - dt.timedelta(hours=1)
    Host.objects.create(
        name="gpu-1", address="10.0.0.1", state=HostState.ONLINE, last_heartbeat=timezone.now()
    )
    for name in ("gpu-7", "gpu-8"):
        Host.objects.create(
            name=name, address="10.0.0.7", state=HostState.UNREACHABLE, last_heartbeat=long_ago
        )
    resolved = Alert.objects.create(
        metric=Metric.HOST_DOWN,
        fingerprint="host_down:host=gpu-7",
        subject="host gpu-7",
        labels={"host": "gpu-7"},
        severity=Severity.CRITICAL,
        state=AlertState.RESOLVED,
        summary="Host gpu-7 sends no heartbeat",
        started_at=long_ago - dt.timedelta(days=1),
    )
    firing = Alert.objects.create(
        metric=Metric.HOST_DOWN,
        fingerprint="host_down:host=gpu-7",
        subject="host gpu-7",
        labels={"host": "gpu-7"},
        severity=Severity.CRITICAL,
        state=AlertState.FIRING,
        summary="Host gpu-7 sends no heartbeat",
        started_at=long_ago,
        fired_at=long_ago + dt.timedelta(minutes=1),
    )
    body = viewer_client.get("/api/fleet/health/").json()
    assert body["window"] == "1h"
    down = body["hosts_down"]
    assert down["count"] == 2
    assert [h["name"] for h in down["hosts"]] == ["gpu-7", "gpu-8"]
    alert = down["hosts"][0]["alert"]
    assert alert["id"] == firing.pk != resolved.pk  # the open one, not the older resolved one
    assert alert["state"] == "firing" and alert["severity"] == "critical" and alert["fired_at"]
    assert down["hosts"][1]["alert"] is None  # the evaluator has not seen it down yet

    # 150 more hosts down: the same queries, and only `hosts` of them named.
    Host.objects.bulk_create(
        Host(name=f"node-{i:03d}", address="10.1.0.1", state=HostState.UNREACHABLE, last_heartbeat=long_ago)
        for i in range(150)
    )
    with CaptureQueriesContext(connection) as few:
        viewer_client.get("/api/fleet/health/", {"hosts": 3})
    body = viewer_client.get("/api/fleet/health/", {"hosts": 3}).json()
    assert body["hosts_down"]["count"] == 152 and len(body["hosts_down"]["hosts"]) == 3
    Host.objects.bulk_create(
        Host(name=f"more-{i:03d}", address="10.2.0.1", state=HostState.UNREACHABLE, last_heartbeat=long_ago)
        for i in range(300)
    )
    with CaptureQueriesContext(connection) as many:
        viewer_client.get("/api/fleet/health/", {"hosts": 100})
    assert len(many) == len(few) <= 8, [q["sql"] for q in many.captured_queries]


def test_points_written_before_the_split_still_count_their_errors(viewer_client: APIClient) -> None:
    bucket = services.bucket_start(time.time(), 10) - 120
    old_shape = {
        "all": {
            "requests": 10,
            "ok": 7,
            "prompt_tokens": 1000,
            "completion_tokens": 200,
            "latency": {str(latency_bucket(300.0)): 10},
        }
    }
    put_point(10, "pool", "legacy", bucket, old_shape)
    body = viewer_client.get("/api/fleet/health/", {"window": "5m"}).json()
    [legacy] = body["pools"]
    assert legacy["name"] == "legacy" and legacy["requests"] == 10
    assert legacy["error_rate"] == pytest.approx(0.3)
    assert legacy["error_rate_4xx"] == 0.0 and legacy["error_rate_5xx"] == 0.0  # split unknown then
    assert near(legacy["latency_p50_ms"], 300.0) and legacy["ttft_p50_ms"] is None


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"window": "2h"}, "window"),
        ({"hosts": "0"}, "hosts"),
        ({"hosts": "101"}, "hosts"),
        ({"since": "1"}, "since"),
    ],
)
def test_bad_input_is_a_field_error(viewer_client: APIClient, query: dict[str, str], field: str) -> None:
    response = viewer_client.get("/api/fleet/health/", query)
    assert response.status_code == 400
    assert list(response.json()) == [field]


def test_signed_in_only(anon_client: APIClient) -> None:
    assert anon_client.get("/api/fleet/health/").status_code in (401, 403)
