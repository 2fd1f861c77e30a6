"""The cache stage's Redis store against real Redis: per-tenant entry and byte bounds evict the oldest,
a too-small bound keeps the newest, tenants are apart, the key follows the request and the served
versions; and the stage's settings are refused with the reason when they cannot work."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from django.conf import settings

from routing.models import RequestLog
from routing.proxy.answercache import CacheConfig, Store, digest, lookup, served_versions
from routing.proxy.config import Canary, Pool, RoutingSnapshot
from routing.proxy.stagespec import ChainError, parse_stages, split

ANSWER = b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}]}'


@pytest.fixture
async def client(redis_clean: None) -> AsyncIterator[aioredis.Redis]:
    redis = aioredis.Redis.from_url(settings.REDIS_URL)
    yield redis
    await redis.aclose()


def config(**over: Any) -> CacheConfig:
    return CacheConfig.of({"ttl_s": 60, **over})


async def test_past_the_entry_bound_the_oldest_entries_are_evicted(client: aioredis.Redis) -> None:
    store, cfg = Store(), config(max_entries=2)
    assert await store.put(client, 1, "a", ANSWER, cfg) == 0
    assert await store.put(client, 1, "b", ANSWER, cfg) == 0
    assert await store.put(client, 1, "c", ANSWER, cfg) == 1
    assert await lookup(client, 1, "a") is None
    assert await lookup(client, 1, "b") is not None and await lookup(client, 1, "c") is not None
    # Storing an entry again replaces it (no double count).
    assert await store.put(client, 1, "c", ANSWER, cfg) == 0
    # Another tenant has its own bound and never sees tenant 1's entries.
    assert await lookup(client, 2, "b") is None
    assert await store.put(client, 2, "x", ANSWER, cfg) == 0
    assert await lookup(client, 1, "b") is not None


async def test_past_the_byte_bound_the_oldest_entries_are_evicted(client: aioredis.Redis) -> None:
    store = Store()
    cfg = config(max_bytes=len(ANSWER) * 3, max_entry_bytes=1024)
    for name in "abc":
        assert await store.put(client, 1, name, ANSWER, cfg) == 0
    assert await store.put(client, 1, "d", ANSWER, cfg) == 1
    assert await lookup(client, 1, "a") is None
    assert all([await lookup(client, 1, n) is not None for n in "bcd"])
    # A larger entry evicts as many of the oldest as it needs room for.
    assert await store.put(client, 1, "e", ANSWER + b" " * len(ANSWER), cfg) == 2
    assert [await lookup(client, 1, n) is not None for n in "bcde"] == [False, False, True, True]


async def test_entries_expire_with_their_ttl(client: aioredis.Redis) -> None:
    await Store().put(client, 1, "a", ANSWER, config(ttl_s=1))
    assert 0 < await client.pttl(settings.REDIS_KEY_PREFIX + "cache:{t1}:a") <= 1000


def test_the_key_follows_the_request_and_the_versions_the_alias_serves() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 0}
    same = digest("chat", "m", "1", body)
    assert digest("chat", "m", "1", {**body, "stream": True, "user": "u", "stream_options": {}}) == same
    assert digest("chat", "m", "1", dict(reversed(body.items()))) == same
    assert digest("chat", "m", "1", {**body, "max_tokens": 3}) != same
    assert digest("chat", "m", "2", body) != same
    assert digest("completion", "m", "1", body) != same
    snapshot = RoutingSnapshot(pools={"p": Pool(name="p", alias="m", version_id=4)})
    assert served_versions(snapshot, "m") == "4"
    snapshot.pools["p"].canary = Canary(rollout_id=1, version_id=5, share=10, sticky_by="tenant")
    assert served_versions(snapshot, "m") == "4,5"  # a rollout starting makes earlier entries miss


@pytest.mark.parametrize(
    ("stage", "reason"),
    [
        ({"ttl_s": 0}, "ttl_s must be an integer from 1 to 604800"),
        ({"ttl_s": "5"}, "ttl_s must be an integer"),
        ({"max_entry_bytes": 10}, "max_entry_bytes must be an integer from 1024"),
        ({"max_entries": 0}, "max_entries must be an integer from 1"),
        ({"max_entry_bytes": 4096, "max_bytes": 2048}, "one entry could never be kept"),
        ({"size": 3}, "unknown keys ['size']"),
    ],
)
def test_cache_settings_that_cannot_work_are_refused(stage: dict[str, Any], reason: str) -> None:
    with pytest.raises(ChainError) as err:
        parse_stages([{"kind": "cache", "config": stage}, {"kind": "generate"}])
    assert reason in str(err.value)


def test_a_cache_stage_after_generation_is_refused() -> None:
    with pytest.raises(ChainError) as err:
        split(parse_stages([{"kind": "generate"}, {"kind": "cache", "name": "late"}]))
    assert "cache stage 'late' comes after the generate step" in str(err.value)


@pytest.mark.django_db
def test_the_api_refuses_cache_settings_with_the_reason(admin_client: Any) -> None:
    stages: list[dict[str, Any]] = [{"kind": "cache", "config": {"ttl_s": 10**9}}, {"kind": "generate"}]
    resp = admin_client.post(
        "/api/stage-chains/", {"name": "c", "alias": "llama", "stages": stages}, format="json"
    )
    assert resp.status_code == 400
    assert "ttl_s must be an integer from 1 to 604800" in resp.json()["stages"][0]
    stages[0]["config"] = {"ttl_s": 30, "max_entries": 100}
    resp = admin_client.post(
        "/api/stage-chains/", {"name": "c", "alias": "llama", "stages": stages}, format="json"
    )
    assert resp.status_code == 201, resp.json()


@pytest.mark.django_db
def test_the_request_log_api_lists_each_stage(admin_client: Any) -> None:
    stages = [{"name": "answers", "kind": "cache", "outcome": "hit", "ms": 0.25}]
    RequestLog.objects.create(status=200, alias="llama", stages=stages)
    RequestLog.objects.create(status=200, alias="llama")
    rows = admin_client.get("/api/request-log/").json()["results"]
    assert sorted(map(str, (r["stages"] for r in rows))) == sorted(map(str, [stages, None]))
