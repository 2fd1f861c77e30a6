"""A beat tick writes the 10 s points of every GPU, engine, pool and tenant from the live records and the
request log, in one INSERT, and writes nothing twice when it runs again in the same bucket."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from core.redis_client import get_redis
from nodes import agent_telemetry, tick_points
from routing.models import MetricRollup
from routing.rollups import services
from routing.rollups.services import named_gauges
from routing.rollups.stats import latency_bucket
from tests.routing.history_helpers import GIB, log_request, make_fleet, publish_engine, publish_gpu

pytestmark = pytest.mark.django_db


def writes(ctx: CaptureQueriesContext) -> list[str]:
    return [
        q["sql"]
        for q in ctx.captured_queries
        if q["sql"].lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE", "COPY"))
    ]


def test_one_insert_per_tick_from_live_records_and_request_log(redis_clean: None, settings: object) -> None:
    fleet = make_fleet()
    now = services.bucket_start(time.time(), 10) + 3.0
    publish_gpu(
        "hist-a", 0, utilization_pct=55.0, memory_used_bytes=70 * GIB, temperature_c=61.0, power_watts=410.0
    )
    # GPU 1 has no live record (agent gone): no point, a gap, not zeros.
    publish_engine(
        fleet.deployment.pk,
        num_requests_running=4,
        num_requests_waiting=1,
        kv_cache_usage_perc=0.25,
        tokens_per_s=300.0,
        ttft_p95_s=0.2,
        itl_p95_s=0.02,
    )
    # The request bucket a tick rolls up is the one that ended REQUEST_LAG_SECONDS - 10 s ago.
    start = services.bucket_start(now, 10) - services.REQUEST_LAG_SECONDS
    pool = fleet.pool.name
    log_request(start + 1, pool, fleet.tenant.pk, latency_ms=100.0, prompt_tokens=100)
    log_request(start + 2, pool, fleet.tenant.pk, status=502, latency_ms=400.0, prompt_tokens=100)
    log_request(start + 3, pool, fleet.tenant.pk, latency_ms=900.0, prompt_tokens=3000)  # long
    log_request(start + 4, "", fleet.tenant.pk, status=401, latency_ms=1.0)  # refused before a pool
    # Refused by the pool's limits with no answer: counted, but its prompt tokens are not.
    log_request(start + 5, pool, fleet.tenant.pk, status=429, prompt_tokens=2000, completion_tokens=None)
    log_request(start - 1, pool, fleet.tenant.pk)  # the bucket before: not this tick's
    log_request(start + 10, pool, fleet.tenant.pk)  # the bucket after: the next tick's

    with CaptureQueriesContext(connection) as ctx:
        offered = services.rollup_tick(now)
    assert len(writes(ctx)) == 1, writes(ctx)
    assert offered == 4

    # GPUs and engines: one row per host, each GPU and engine a member of it (GPU 1 absent).
    rows = {(r.kind, r.subject): r for r in MetricRollup.objects.all()}
    assert set(rows) == {
        ("gpu", "hist-a"),
        ("engine", "hist-a"),
        ("pool", pool),
        ("tenant", str(fleet.tenant.pk)),
    }
    gpu = rows[("gpu", "hist-a")]
    assert gpu.resolution_s == 10 and gpu.bucket.timestamp() == services.bucket_start(now, 10)
    assert set(gpu.values) == {"0"}
    assert named_gauges("gpu", gpu.values["0"]) == {
        "n": 1,
        "utilization_pct": 55.0,
        "memory_used_bytes": 70.0 * GIB,
        "memory_total_bytes": 80.0 * GIB,
        "temperature_c": 61.0,
        "power_watts": 410.0,
    }
    engine = named_gauges("engine", rows[("engine", "hist-a")].values[str(fleet.deployment.pk)])
    assert (
        engine["tokens_per_s"] == 300.0
        and engine["ttft_p95_s"] == 0.2
        and engine["num_requests_waiting"] == 1.0
    )

    pool_row = rows[("pool", pool)]
    assert pool_row.bucket.timestamp() == start
    parts = pool_row.values
    assert parts["all"]["requests"] == 4 and parts["all"]["ok"] == 2 and parts["all"]["4xx"] == 1
    # The 502 had its answer under way (20 tokens): admitted; the 429's 2,000 prompt tokens are not.
    assert parts["all"]["prompt_tokens"] == 3200 and parts["all"]["completion_tokens"] == 60
    assert parts["short"]["requests"] == 3 and parts["short"]["ok"] == 1
    assert parts["long"]["requests"] == 1 and parts["long"]["ok"] == 1
    assert parts["long"]["latency"] == {str(latency_bucket(900.0)): 1}
    tenant = rows[("tenant", str(fleet.tenant.pk))].values
    assert set(tenant) == {"all"} and tenant["all"]["requests"] == 5 and tenant["all"]["ok"] == 2

    # Beat firing twice in one bucket: the same rows are offered and none is written twice.
    services.rollup_tick(now + 1)
    assert MetricRollup.objects.count() == 4


def test_points_with_copy_special_characters_are_written_as_they_are() -> None:
    # The tick writes by COPY's text format: a backslash, tab or line break in a subject or in the
    # JSON must reach the row unchanged (an unescaped tab would shift the columns).
    at = dt.datetime.fromtimestamp(services.bucket_start(time.time(), 10), dt.UTC)
    subject = "pool\\with\ttab"
    values = {"all": {"note": "line\nbreak \\ and \t tab"}}
    assert services._insert([(10, "pool", subject, at, values)]) == 1
    row = MetricRollup.objects.get(resolution_s=10, kind="pool", bucket=at)
    assert (row.subject, row.values) == (subject, values)
    # The same point again: skipped (the COPY fails on the unique bucket and the fallback skips it).
    assert services._insert([(10, "pool", subject, at, {"all": {}})]) == 1
    assert MetricRollup.objects.get(resolution_s=10, kind="pool", bucket=at).values == values


def _agent_sync(host: str, deployment_id: int, deployment_name: str) -> int:
    """What one agent sync writes (the ingest's and the full sync's script call); returns the 10 s
    bucket it wrote its host point into."""
    for _ in range(3):
        began = tick_points.bucket_of(time.time())
        out = agent_telemetry.telemetry(
            host,
            {deployment_id: (deployment_name, "ready")},
            {0, 1},
            engines=[
                {
                    "deployment_id": deployment_id,
                    "ts": time.time(),
                    "num_requests_running": 3,
                    "kv_cache_usage_perc": 0.5,
                    "tokens_per_s": 120.0,
                    "ttft_p95_s": None,
                }
            ],
            gpus=[
                {
                    "index": 0,
                    "ts": time.time(),
                    "utilization_pct": 40.0,
                    "memory_used_bytes": 10.0 * GIB,
                    "memory_total_bytes": 80.0 * GIB,
                    "temperature_c": 50.0,
                    "power_watts": True,
                }
            ],
            info={},
        )
        keys, args = out.script_call([])
        get_redis().register_script(agent_telemetry.WRITE_SCRIPT)(keys=keys, args=args)
        if tick_points.bucket_of(time.time()) == began:  # not split by a bucket's end
            return began
    raise AssertionError("three syncs in a row straddled a bucket's end")


def test_a_synced_hosts_point_is_the_one_its_agent_wrote_the_others_read_live(redis_clean: None) -> None:
    synced = make_fleet("hist-a")
    local = make_fleet("hist-b")
    bucket = _agent_sync("hist-a", synced.deployment.pk, synced.deployment.name)
    # A later live record of the synced host is not what its point of that bucket keeps: the tick read
    # the point its agent wrote, not the live records (a bool is never a gauge: power is null).
    publish_gpu("hist-a", 0, utilization_pct=99.0)
    # The other host's records are written outside the agent sync (the in-process supervisor).
    publish_gpu("hist-b", 1, utilization_pct=7.0)
    publish_engine(local.deployment.pk, num_requests_running=1)

    now = bucket + 10 + 3.0  # the next bucket's tick
    assert services.rollup_tick(now) == 4
    rows = {(r.kind, r.subject): r for r in MetricRollup.objects.all()}
    assert set(rows) == {("gpu", "hist-a"), ("engine", "hist-a"), ("gpu", "hist-b"), ("engine", "hist-b")}

    gpu = rows[("gpu", "hist-a")]
    assert gpu.bucket.timestamp() == bucket  # the bucket its agent wrote it in
    assert named_gauges("gpu", gpu.values["0"]) == {
        "n": 1,
        "utilization_pct": 40.0,
        "memory_used_bytes": 10.0 * GIB,
        "memory_total_bytes": 80.0 * GIB,
        "temperature_c": 50.0,
    }
    engine = rows[("engine", "hist-a")]
    assert engine.bucket.timestamp() == bucket
    assert named_gauges("engine", engine.values[str(synced.deployment.pk)]) == {
        "n": 1,
        "num_requests_running": 3.0,
        "kv_cache_usage_perc": 0.5,
        "tokens_per_s": 120.0,
    }
    # The host with no agent point: its live records as they are at the tick, at the tick's bucket.
    other = rows[("gpu", "hist-b")]
    assert other.bucket.timestamp() == bucket + 10
    assert named_gauges("gpu", other.values["1"])["utilization_pct"] == 7.0
    assert rows[("engine", "hist-b")].bucket.timestamp() == bucket + 10

    # Run again in the same bucket: the points already written are skipped, not doubled.
    services.rollup_tick(now + 1)
    assert MetricRollup.objects.count() == 4
