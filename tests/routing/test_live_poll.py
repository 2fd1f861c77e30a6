"""The proxy's read of the engines' live records (routing/proxy/services.py, LiveState.poll): each new
record reaches routing, a record read again unchanged is not parsed again, and a patched snapshot (a new
object) is polled with its own endpoints."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest
from django.conf import settings

from core.redis_client import async_redis, get_redis
from nodes.lifecycle import live_deployment_key
from routing.proxy import services
from routing.proxy.config import Endpoint, RoutingSnapshot
from routing.proxy.services import LiveState


def _snapshot(*deployment_ids: int) -> RoutingSnapshot:
    return RoutingSnapshot(
        endpoints={
            str(pk): Endpoint(str(pk), pk, f"http://127.0.0.1:{9000 + pk}", "", "m", None, 16)
            for pk in deployment_ids
        }
    )


def _write(deployment_id: int, usage: float, ts: float) -> None:
    record = {
        "deployment_id": deployment_id,
        "ts": ts,
        "kv_cache_usage_perc": usage,
        "kv_cache_total_tokens": 1000,
    }
    get_redis().set(live_deployment_key(deployment_id), orjson.dumps(record), ex=10)


def test_each_new_record_reaches_routing_and_an_unchanged_one_is_not_parsed_again(
    redis_clean: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[bytes] = []
    real_loads = orjson.loads

    def counting_loads(raw: bytes) -> object:
        parsed.append(raw)
        return real_loads(raw)

    monkeypatch.setattr(services.orjson, "loads", counting_loads)
    live = LiveState()
    now = time.time()
    _write(1, 0.25, now)
    _write(2, 0.5, now)

    async def run() -> list[int | None]:
        client = async_redis(settings.REDIS_URL)
        snap = _snapshot(1, 2)
        free: list[int | None] = []
        try:
            await live.poll(client, snap)
            await live.poll(client, snap)  # nothing new: no parse
            free.append(live.of(snap.endpoints["1"]).kv_free_tokens)
            assert len(parsed) == 2
            _write(1, 0.75, now + 1)
            await live.poll(client, snap)
            free.append(live.of(snap.endpoints["1"]).kv_free_tokens)
            assert len(parsed) == 3
            # A patched snapshot adds an engine: its record is read, the others' unchanged ones are not.
            _write(3, 0.1, now + 1)
            patched = _snapshot(1, 2, 3)
            await live.poll(client, patched)
            free.append(live.of(patched.endpoints["3"]).kv_free_tokens)
            assert len(parsed) == 4
        finally:
            await client.aclose()
        return free

    assert asyncio.run(run()) == [750, 250, 900]
