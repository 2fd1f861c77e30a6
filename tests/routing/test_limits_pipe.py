"""The limiter's pipelined Redis connection against real Redis: replies matched to their requests, a
flushed script cache, a lost or silent connection, completions that need no reply, AUTH and SELECT."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
import redis.asyncio as aioredis
from django.conf import settings

from core.redis_client import key as rkey
from routing.proxy.config import Limits
from routing.proxy.errors import ProxyError
from routing.proxy.limits import FINISH_DELAY_S, PIPE_NAME, Limiter, budget_key
from routing.proxy.redispipe import RedisPipe, pack
from tests.routing.limits_helpers import key_info


@pytest.fixture
async def limiter(redis_clean: None) -> AsyncIterator[Limiter]:
    client = aioredis.Redis.from_url(settings.REDIS_URL)
    lim = Limiter(client, lease_ms=5_000)
    yield lim
    await lim.aclose()
    await client.aclose()


def sync_redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


async def test_pipelined_replies_reach_their_own_requests(limiter: Limiter) -> None:
    # 40 admissions queued in one loop iteration leave in one write; each must get its own reply:
    # the 25 admitted see every remaining count from 24 down to 0 exactly once.
    info = key_info(requests_per_minute=25)
    results = await asyncio.gather(
        *(limiter.admit(info, f"p{i}", 1) for i in range(40)), return_exceptions=True
    )
    admitted = [r for r in results if not isinstance(r, BaseException) and r is not None]
    refused = [r for r in results if isinstance(r, ProxyError)]
    assert len(admitted) == 25 and len(refused) == 15
    remaining = sorted(int(dict(a.headers)[b"x-ratelimit-remaining-requests"]) for a in admitted)
    assert remaining == list(range(25))
    assert sync_redis().zcard(rkey("rl", "t1", "rpm")) == 25


async def test_completion_without_reply_still_reaches_redis(limiter: Limiter) -> None:
    info = key_info(max_concurrent_requests=5, tokens_per_minute=1000)
    held = await limiter.admit(info, "a", 300)
    assert held is not None
    r = sync_redis()
    assert r.zcard(rkey("rl", "t1", "conc")) == 1 and int(r.get(rkey("rl", "t1", "tpm_sum")) or 0) == 300
    await limiter.finish(held, 40)
    # No other command follows, so it leaves on its own within FINISH_DELAY_S; seen from another client.
    deadline = time.monotonic() + FINISH_DELAY_S + 1.0
    while r.zcard(rkey("rl", "t1", "conc")) and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    assert r.zcard(rkey("rl", "t1", "conc")) == 0
    assert int(r.get(rkey("rl", "t1", "tpm_sum")) or 0) == 40


async def test_flushed_script_cache_is_recovered(limiter: Limiter) -> None:
    info = key_info(requests_per_minute=3, tokens_per_minute=1000)
    first = await limiter.admit(info, "a", 10)
    assert first is not None
    sync_redis().script_flush()
    # EVALSHA now finds nothing: the limiter resends the script's source, admits, then refuses as before.
    assert await limiter.admit(info, "b", 10) is not None
    await limiter.finish(first, 1)  # completions travel by source, unaffected
    assert await limiter.admit(info, "c", 10) is not None
    with pytest.raises(ProxyError) as refused:
        await limiter.admit(info, "d", 10)
    assert refused.value.code == "rate_limit_exceeded"
    assert int(sync_redis().get(rkey("rl", "t1", "tpm_sum")) or 0) == 21


async def test_lost_connection_is_reopened(limiter: Limiter) -> None:
    info = key_info(requests_per_minute=100)
    assert await limiter.admit(info, "a", 1) is not None
    r = sync_redis()
    assert limiter.pipe is not None
    before = limiter.pipe.local_address()
    ours = [c for c in r.client_list() if c["addr"] == before]
    assert len(ours) == 1 and ours[0]["name"] == PIPE_NAME
    r.client_kill_filter(_id=ours[0]["id"])
    await asyncio.sleep(0.05)  # the close reaches the limiter's event loop
    assert await limiter.admit(info, "b", 1) is not None
    after = limiter.pipe.local_address()
    assert after != before and [c["name"] for c in r.client_list() if c["addr"] == after] == [PIPE_NAME]


@contextlib.contextmanager
def silent_redis() -> Iterator[int]:
    """A server that answers the limiter's set-up (SCRIPT LOAD, CLIENT SETNAME) and then never again."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]

    tasks: list[asyncio.Task[None]] = []

    async def answer_setup_only(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read(65536)
        # The set-up commands arrive in one write: CLIENT SETNAME ("+OK"), SCRIPT LOAD (a digest).
        assert b"SETNAME" in data and b"LOAD" in data
        writer.write(b"+OK\r\n$40\r\n" + b"0" * 40 + b"\r\n")
        await writer.drain()
        await reader.read()  # swallow everything after
        writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks.append(asyncio.current_task())  # type: ignore[arg-type]
        with contextlib.suppress(asyncio.CancelledError):
            await answer_setup_only(reader, writer)

    async def main(stop: asyncio.Event) -> None:
        srv = await asyncio.start_server(serve, sock=server)
        async with srv:
            await stop.wait()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(target=loop.run_until_complete, args=(main(stop),), daemon=True)
    thread.start()
    try:
        yield port
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(5)


async def test_silent_redis_fails_closed_within_the_timeout() -> None:
    with silent_redis() as port:
        client = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_timeout=0.3)
        limiter = Limiter(client)
        started = time.monotonic()
        with pytest.raises(ProxyError) as refused:
            await limiter.admit(key_info(requests_per_minute=10), "x", 1)
        assert refused.value.status == 503 and refused.value.code == "limits_unavailable"
        assert time.monotonic() - started < 1.5
        await limiter.aclose()
        await client.aclose()


@pytest.fixture
def password_redis() -> Iterator[int]:
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--requirepass", "s3cret", "--save", ""],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                if redis.Redis(port=port, password="s3cret").ping():
                    break
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


async def test_auth_and_database_from_the_url(password_redis: int) -> None:
    client = aioredis.Redis.from_url(f"redis://:s3cret@127.0.0.1:{password_redis}/3")
    limiter = Limiter(client)
    assert await limiter.admit(key_info(requests_per_minute=10), "x", 1) is not None
    in_db3 = redis.Redis(port=password_redis, password="s3cret", db=3)
    assert in_db3.zcard(rkey("rl", "t1", "rpm")) == 1
    await limiter.aclose()
    await client.aclose()

    wrong = aioredis.Redis.from_url(f"redis://:wrong@127.0.0.1:{password_redis}/3")
    refused_limiter = Limiter(wrong)
    with pytest.raises(ProxyError) as refused:
        await refused_limiter.admit(key_info(requests_per_minute=10), "y", 1)
    assert refused.value.status == 503
    await refused_limiter.aclose()
    await wrong.aclose()


class _OtherConnection(aioredis.Connection):
    """Stands for a connection the pipe does not speak for (TLS, say): the limiter keeps redis-py."""


async def test_clients_the_pipe_cannot_serve_keep_redis_py(redis_clean: None) -> None:
    pool = aioredis.ConnectionPool.from_url(settings.REDIS_URL, connection_class=_OtherConnection)
    client = aioredis.Redis(connection_pool=pool)
    limiter = Limiter(client)
    info = key_info(requests_per_minute=2, tokens_per_minute=100)
    first = await limiter.admit(info, "a", 60)
    assert first is not None
    with pytest.raises(ProxyError):
        await limiter.admit(info, "b", 60)  # 60 + 60 > 100
    await limiter.finish(first, 10)
    assert await limiter.admit(info, "c", 60) is not None
    assert limiter.pipe is None
    await limiter.aclose()
    await client.aclose()


async def test_completions_of_several_keys_ride_in_the_next_admission(limiter: Limiter) -> None:
    # Two tenants, the second also with a key override (two scopes): their completions are queued and
    # run at the start of the next admission's script, each against its own keys, before it decides.
    one = key_info(tenant_id=1, key_id=1, tokens_per_minute=100, max_concurrent_requests=1)
    two = dataclasses.replace(
        key_info(tenant_id=2, key_id=2, tokens_per_minute=1000, daily_token_budget=5000),
        key_limits=Limits(max_concurrent_requests=1, tokens_per_minute=500),
    )
    a = await limiter.admit(one, "a", 90)
    b = await limiter.admit(two, "b", 400)
    assert a is not None and b is not None
    await limiter.finish(a, 20)
    await limiter.finish(b, 150)
    # Tenant 1 had 10 tokens and no lease left; only the folded completion makes room for this one.
    c = await limiter.admit(one, "c", 80)
    assert c is not None
    r = sync_redis()
    assert int(r.get(rkey("rl", "t1", "tpm_sum")) or 0) == 100
    assert r.zrange(rkey("rl", "t1", "conc"), 0, -1) == [b"c"]
    assert int(r.get(rkey("rl", "t2", "tpm_sum")) or 0) == 150
    assert int(r.get(rkey("rl", "k2", "tpm_sum")) or 0) == 150
    assert r.zcard(rkey("rl", "k2", "conc")) == 0
    assert int(r.get(budget_key("t2", limiter._today()[0])) or 0) == 150
    # The key's lease is free again: a second request on it is admitted.
    assert await limiter.admit(two, "d", 10) is not None


async def test_commands_sent_while_connecting_wait_for_the_set_up(redis_clean: None) -> None:
    # The connection is made (connection_made) one or more loop iterations before the set-up commands
    # (SELECT, CLIENT SETNAME, SCRIPT LOAD) are written. A command sent in that gap must not be written
    # ahead of them: it would run in database 0 and its reply would go to a set-up command's waiter, and
    # the set-up's "OK" to it (seen under load as "not enough values to unpack (expected 8, got 2)").
    db = int(settings.REDIS_URL.rsplit("/", 1)[1] or 0) + 1
    other = redis.Redis.from_url(settings.REDIS_URL.rsplit("/", 1)[0] + f"/{db}")
    zero = redis.Redis.from_url(settings.REDIS_URL.rsplit("/", 1)[0] + "/0")
    counter = "inferchain-test:pipe-connect-race"
    other.delete(counter)
    zero.delete(counter)
    pipe = RedisPipe(port=int(settings.REDIS_URL.split(":")[-1].split("/")[0]), db=db, name="race-test")
    replies: list[object] = []

    async def every_iteration() -> None:
        # One INCR per loop iteration until the connection is up: one of them lands in the gap.
        for _ in range(200):
            replies.append(await pipe.send(pack("INCR", counter)))

    sent = [asyncio.ensure_future(pipe.send(pack("INCR", counter)))]
    for _ in range(20):
        sent.append(asyncio.ensure_future(every_iteration()))
        await asyncio.sleep(0)
    await asyncio.gather(*sent)
    await pipe.aclose()
    first = sent[0].result()
    got = [first, *replies]
    assert all(isinstance(r, int) for r in got), [r for r in got if not isinstance(r, int)][:3]
    assert sorted(got) == list(range(1, len(got) + 1))  # each INCR got its own reply
    assert int(other.get(counter) or 0) == len(got) and zero.get(counter) is None
    other.delete(counter)
