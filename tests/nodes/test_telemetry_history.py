"""The last hour of GPU and engine samples: kept in real Redis, trimmed to the hour, read back as columns
by /api/telemetry/history/ for the console's charts."""

from __future__ import annotations

import time
from typing import Any

import pytest
from rest_framework.test import APIClient

from core.redis_client import get_redis
from nodes import history
from nodes.agent import runtime
from nodes.api.serializers import EngineHistorySerializer, GpuHistorySerializer
from nodes.models import Host
from tests.nodes.conftest import READY, supervisor_for, tick_until


def gpu_sample(ts: float, util: float, power: float | None = 300.0) -> dict[str, Any]:
    return {
        "index": 0,
        "ts": ts,
        "simulated": True,
        "utilization_pct": util,
        "memory_used_bytes": 40 * 1024**3,
        "memory_total_bytes": 80 * 1024**3,
        "temperature_c": 55.0,
        "power_watts": power,
    }


def engine_record(ts: float, deployment_id: int, tps: float) -> dict[str, Any]:
    return {
        "ts": ts,
        "deployment_id": deployment_id,
        "tokens_per_s": tps,
        "kv_cache_usage_perc": 0.25,
        "num_requests_running": 3.0,
        "num_requests_waiting": 0.0,
        "ttft_p50_s": None,
        "itl_p50_s": 0.02,
    }


def append(host: str, gpus: list[dict[str, Any]], engines: list[dict[str, Any]]) -> None:
    pipe = get_redis().pipeline(transaction=False)
    history.record(pipe, host, gpus, engines)
    pipe.execute()


def test_a_tick_is_kept_as_columns_with_gaps(redis_clean: None) -> None:
    now = time.time()
    append("h1", [gpu_sample(now - 1, 10.0, power=None)], [engine_record(now - 1, 7, 100.0)])
    append("h1", [gpu_sample(now, 90.0)], [engine_record(now, 7, 250.0)])

    gpus, engines = history.read([("h1", 0), ("h1", 1)], [7, 8], minutes=60)
    gpu = gpus[("h1", 0)]
    assert gpu.t == [now - 1, now]
    assert gpu.values["utilization_pct"] == [10.0, 90.0]
    # A sample without a power reading is a gap, not a zero.
    assert gpu.values["power_watts"] == [None, 300.0]
    assert engines[7].values["tokens_per_s"] == [100.0, 250.0]
    assert engines[7].values["ttft_p50_s"] == [None, None]
    # Series nobody wrote come back empty, with every column present.
    assert gpus[("h1", 1)].t == [] and set(gpus[("h1", 1)].values) == set(history.GPU_FIELDS)
    assert engines[8].t == []


def test_entries_older_than_the_hour_are_trimmed_and_series_expire(redis_clean: None, settings: Any) -> None:
    settings.NODE_HISTORY_SECONDS = 3600
    r = get_redis()
    key = history.gpu_series_key("h1", 0)
    now_ms = int(time.time() * 1000)
    # Two entries written before this hour and one inside it (explicit stream IDs = their time).
    for age_s, util in ((7200, 1.0), (3700, 2.0), (1800, 3.0)):
        ts = (now_ms - age_s * 1000) / 1000
        r.xadd(key, history.encode(gpu_sample(ts, util), history.GPU_FIELDS), id=f"{now_ms - age_s * 1000}-0")
    assert r.xlen(key) == 3

    append("h1", [gpu_sample(now_ms / 1000, 4.0)], [])

    gpus, _ = history.read([("h1", 0)], [], minutes=60)
    assert gpus[("h1", 0)].values["utilization_pct"] == [3.0, 4.0]
    assert r.xlen(key) == 2
    assert 3500 < r.ttl(key) <= 3600
    # A shorter window reads only what falls in it.
    gpus, _ = history.read([("h1", 0)], [], minutes=10)
    assert gpus[("h1", 0)].values["utilization_pct"] == [4.0]


def test_more_points_than_a_chart_needs_come_back_as_bucket_means() -> None:
    series = history.Series(
        t=[float(i) for i in range(10)], values={"v": [1.0, 3.0, None, 5.0, 2, 2, 8, None, 1, 1]}
    )
    out = history.downsample(series, max_points=5)
    assert out.t == [1.0, 3.0, 5.0, 7.0, 9.0]
    assert out.values["v"] == [2.0, 5.0, 2.0, 8.0, 1.0]
    assert history.downsample(series, max_points=10) is series


@pytest.mark.django_db
def test_history_api_refuses_bad_queries(viewer_client: APIClient) -> None:
    assert viewer_client.get("/api/telemetry/history/", {"minutes": 0}).status_code == 400
    assert viewer_client.get("/api/telemetry/history/", {"minutes": 61}).status_code == 400
    missing = viewer_client.get("/api/telemetry/history/", {"deployment": 999999})
    assert missing.status_code == 400
    assert "deployment" in missing.json()
    assert APIClient().get("/api/telemetry/history/").status_code in (401, 403)


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_agent_ticks_reach_the_history_api(
    host: Host, make_deployment: Any, viewer_client: APIClient, redis_clean: None
) -> None:
    deployment = make_deployment()
    other = make_deployment(gpu_indices=[0], gpu_memory_utilization=0.4)
    supervisor = supervisor_for(host)
    supervisor.start()
    try:
        assert runtime.launch(deployment.pk) == "started"
        tick_until(supervisor, deployment, READY)
        for _ in range(3):
            supervisor.tick()
    finally:
        supervisor.close()

    body = viewer_client.get("/api/telemetry/history/", {"deployment": deployment.pk}).json()
    assert body["minutes"] == 60
    # The deployment and the GPU it runs on; not the other deployment.
    assert [e["deployment_id"] for e in body["engines"]] == [deployment.pk]
    assert [(g["host"], g["index"]) for g in body["gpus"]] == [(host.name, 0)]
    engine, gpu = body["engines"][0], body["gpus"][0]
    assert set(engine) == set(EngineHistorySerializer().fields)
    assert set(gpu) == set(GpuHistorySerializer().fields)
    assert len(engine["t"]) >= 3 and engine["t"] == sorted(engine["t"])
    assert all(len(engine[name]) == len(engine["t"]) for name in history.ENGINE_FIELDS)
    assert len(gpu["t"]) >= 4 and len(gpu["utilization_pct"]) == len(gpu["t"])
    assert gpu["memory_used_bytes"][-1] > 0  # the engine's reservation on the simulated GPU

    fleet = viewer_client.get("/api/telemetry/history/").json()
    assert {e["deployment_id"] for e in fleet["engines"]} == {deployment.pk, other.pk}
    assert next(e for e in fleet["engines"] if e["deployment_id"] == other.pk)["t"] == []
