"""After a Redis restart no request fails on a connection pooled before it: redis-py's clients and the
limiter's pipelined connection resend a call that failed on a dead connection once, on a fresh one.
Loss and recovery are each logged once. Uses a private redis-server (tests/private_redis.py)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from core import redis_client
from routing.proxy.limits import ALLOWANCE_MS
from routing.proxy.redispipe import RedisPipe, pack
from tests.private_redis import PrivateRedis, private_redis  # noqa: F401 - fixture
from tests.routing.conftest import Proc, make_tenant_key, post

BODY = {"model": "trivial", "messages": [{"role": "user", "content": "hi"}]}


def _messages(caplog: pytest.LogCaptureFixture, link: str) -> tuple[int, int]:
    lost = sum(f"Redis ({link}) unreachable" in r.getMessage() for r in caplog.records)
    back = sum(f"Redis ({link}) reachable again" in r.getMessage() for r in caplog.records)
    return lost, back


def test_async_client_pooled_connections_survive_a_restart(
    private_redis: PrivateRedis,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="core.redis")

    async def scenario() -> None:
        client = redis_client.async_redis(private_redis.url, link="t-async", socket_timeout=1.0)
        # Eight connections in the pool, all made before the restart.
        await asyncio.gather(*(client.blpop(["nothing"], timeout=0.05) for _ in range(8)))
        assert len(client.connection_pool._available_connections) == 8
        private_redis.restart()
        for _ in range(3):  # every pooled connection is stale; none may fail a call
            assert await asyncio.gather(*(client.ping() for _ in range(8))) == [True] * 8
        assert _messages(caplog, "t-async") == (0, 0)  # a restart that costs no call is no outage

        private_redis.stop()
        for _ in range(5):
            with pytest.raises(redis.ConnectionError):
                await client.ping()
        private_redis.start()
        assert await client.ping()
        assert await client.ping()
        await client.aclose()

    asyncio.run(scenario())
    assert _messages(caplog, "t-async") == (1, 1)


def test_sync_client_survives_a_restart(private_redis: PrivateRedis, settings: object) -> None:  # noqa: F811
    settings.REDIS_URL = private_redis.url  # type: ignore[attr-defined]
    redis_client.get_redis.cache_clear()
    try:
        client = redis_client.get_redis()
        barrier = threading.Barrier(6)

        def hold() -> None:
            with client.pipeline(transaction=False) as pipe:
                barrier.wait(5)
                pipe.ping()
                pipe.execute()

        with ThreadPoolExecutor(6) as pool:
            list(pool.map(lambda _: hold(), range(6)))
        private_redis.restart()
        with ThreadPoolExecutor(6) as pool:
            assert list(pool.map(lambda _: client.ping(), range(30))) == [True] * 30
    finally:
        redis_client.get_redis.cache_clear()


def test_pipe_resends_once_on_a_fresh_connection(
    private_redis: PrivateRedis,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="core.redis")

    async def scenario() -> None:
        pipe = RedisPipe(port=private_redis.port, reply_timeout=1.0, connect_timeout=1.0, link="t-pipe")
        assert await pipe.send(pack("PING")) == b"PONG"
        private_redis.restart()
        # Sent on the dead socket before the loss was seen: resent on a new connection, answered.
        assert await asyncio.gather(*(pipe.send(pack("INCR", "n")) for _ in range(5))) == [1, 2, 3, 4, 5]
        private_redis.stop()
        with pytest.raises(redis.ConnectionError):
            await pipe.send(pack("PING"))
        with pytest.raises(redis.ConnectionError):
            await pipe.send(pack("PING"))
        private_redis.start()
        assert await pipe.send(pack("PING")) == b"PONG"
        await pipe.aclose()

    asyncio.run(scenario())
    lost, back = _messages(caplog, "t-pipe")
    assert lost >= 1 and back >= 1 and lost == back, (lost, back)
    assert lost <= 2  # the restart's loss, and the outage's: never once per call


@pytest.mark.django_db(transaction=True)
def test_proxy_serves_every_request_after_a_redis_restart(
    private_redis: PrivateRedis,  # noqa: F811
    start_proxy: Callable[..., Proc],
    trivial_backend: Proc,
    record_property: Callable[[str, object], None],
) -> None:
    limited = make_tenant_key("restart", requests_per_minute=100_000)
    proxy = start_proxy(static=f"trivial={trivial_backend.url}", REDIS_URL=private_redis.url)
    url = proxy.url + "/v1/chat/completions"

    def burst(n: int) -> list[int]:
        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(lambda _: post(url, limited.raw_key, BODY).status, range(n)))

    assert burst(32) == [200] * 32
    private_redis.restart()
    after = burst(64)
    # The proxy's log says which call failed, if one did (it failed once under a loaded full suite).
    assert after == [200] * 64, (
        f"a request failed on a connection pooled before the restart: {after}\n"
        + proxy.log_path.read_text(errors="replace")[-4000:]
    )

    private_redis.stop()
    # An allowance the process still holds admits until its term ends (docs/proxy.md, "Allowances").
    time.sleep(ALLOWANCE_MS / 1000 + 0.05)
    refused = post(url, limited.raw_key, BODY)
    assert refused.status == 503 and refused.json()["error"]["code"] == "limits_unavailable"
    assert post(url, limited.raw_key, BODY).status == 503
    private_redis.start()
    back_at = time.monotonic()
    while post(url, limited.raw_key, BODY).status != 200:
        assert time.monotonic() - back_at < 5, "the proxy did not recover by itself"
        time.sleep(0.01)
    # Reported (e.g. --junitxml), not asserted beyond the bound above: docs/proxy.md quotes it.
    record_property("served_again_after_redis_start_s", round(time.monotonic() - back_at, 3))
    assert burst(64) == [200] * 64
    log = proxy.log()
    assert log.count("Redis (limiter) unreachable") == log.count("Redis (limiter) reachable again") >= 1
    assert log.count("Redis (limiter) unreachable") <= 2, log[-3000:]
