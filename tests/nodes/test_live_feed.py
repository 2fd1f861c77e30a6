"""Telemetry reaches Redis (for the proxy) and the browser's WebSocket (fleet and host groups)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from console.models import User
from core.consumers import LiveConsumer
from core.live import deployment_group
from core.redis_client import get_redis
from nodes.agent import runtime
from nodes.api.serializers import EngineLiveSerializer, GpuSampleSerializer
from nodes.lifecycle import live_deployment_key, live_gpu_key
from tests.nodes.conftest import READY, supervisor_for, tick_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


async def collect(comm: WebsocketCommunicator, kinds: set[str], timeout: float = 10) -> dict[str, Any]:
    """The first event of each type in `kinds`, whatever order they arrive in."""
    seen: dict[str, Any] = {}
    deadline = time.monotonic() + timeout
    while set(seen) != kinds and time.monotonic() < deadline:
        event = await comm.receive_json_from(timeout=timeout)
        if event.get("type") in kinds:
            seen.setdefault(event["type"], event)
    assert set(seen) == kinds, seen
    return seen


async def test_gpu_and_engine_samples_are_pushed_and_stored(
    host: Any, make_deployment: Any, redis_clean: None
) -> None:
    deployment = await database_sync_to_async(make_deployment)()
    supervisor = supervisor_for(host)
    await database_sync_to_async(supervisor.start)()
    await database_sync_to_async(runtime.launch)(deployment.pk)
    await database_sync_to_async(tick_until)(supervisor, deployment, READY)

    user = await database_sync_to_async(User.objects.create)(username="watcher", role="viewer")
    comm = WebsocketCommunicator(LiveConsumer.as_asgi(), "/ws/live/")
    comm.scope["user"] = user
    connected, _ = await comm.connect()
    assert connected
    await comm.send_json_to({"subscribe": deployment_group(deployment.pk)})
    assert (await comm.receive_json_from(timeout=5))["type"] == "subscribed"

    before = time.time()
    await database_sync_to_async(supervisor.tick)()
    events = await collect(comm, {"host.telemetry", "deployment.metrics"})
    telemetry = events["host.telemetry"]
    assert telemetry["host"] == host.name and telemetry["simulated"] is True
    gpu = telemetry["gpus"][0]
    assert gpu["index"] == 0 and gpu["simulated"] is True
    assert gpu["memory_total_bytes"] > 0 and gpu["memory_used_bytes"] > 0  # the engine's reservation
    assert before <= telemetry["ts"] <= time.time()
    engine = next(e for e in telemetry["engines"] if e["deployment_id"] == deployment.pk)
    assert engine["state"] == "ready" and engine["kv_cache_total_tokens"] > 0

    assert events["deployment.metrics"]["deployment_id"] == deployment.pk
    await comm.disconnect()

    redis = get_redis()
    live = json.loads(redis.get(live_deployment_key(deployment.pk)) or b"{}")
    contract = (
        "ts state num_requests_running num_requests_waiting kv_cache_usage_perc num_gpu_blocks block_size "
        "kv_cache_total_tokens prompt_tokens_total generation_tokens_total tokens_per_s ttft_p50_s itl_p50_s"
    )
    for field in contract.split():
        assert field in live
    # The API schema (and so the console's generated types) describes exactly what the agent writes.
    assert set(live) == set(EngineLiveSerializer().fields)
    assert set(gpu) == set(GpuSampleSerializer().fields)
    assert 0 < redis.ttl(live_deployment_key(deployment.pk)) <= 5
    gpu_live = json.loads(redis.get(live_gpu_key(host.name, 0)) or b"{}")
    assert gpu_live["simulated"] is True and gpu_live["memory_total_bytes"] == gpu["memory_total_bytes"]
    await database_sync_to_async(supervisor.close)()
