"""Allowances against real Redis: a busy key is admitted without a round trip per request, and the limits
stay exact across processes (each Limiter here has its own connection, as each proxy process does)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from django.conf import settings

from core.redis_client import key as rkey
from routing.proxy.errors import ProxyError
from routing.proxy.limits import ALLOWANCE_MS, Admission, Limiter, budget_key
from tests.private_redis import PrivateRedis
from tests.routing.limits_helpers import key_info

HIGH = {
    "requests_per_minute": 1_000_000,
    "tokens_per_minute": 1_000_000_000,
    "max_concurrent_requests": 100_000,
    "daily_token_budget": 10**15,
}
TERM_S = ALLOWANCE_MS / 1000
# Several terms: what one process's allowance left unused goes back and the other takes it.
HAMMER_S = 8 * TERM_S


@pytest.fixture
async def limiters(redis_clean: None) -> AsyncIterator[Callable[[], Limiter]]:
    made: list[tuple[Limiter, aioredis.Redis]] = []

    def make() -> Limiter:
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        limiter = Limiter(client, lease_ms=5_000)
        made.append((limiter, client))
        return limiter

    yield make
    for limiter, client in made:
        await limiter.aclose()
        await client.aclose()


def sync_redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


def counted(scope: str = "t1") -> dict[str, int]:
    """What Redis counts for a scope: requests and tokens in the window, live leases, today's budget."""
    r = sync_redis()
    budgets = list(r.scan_iter(match=budget_key(scope, "*")))
    return {
        "requests": r.zcard(rkey("rl", scope, "rpm")),
        "tokens": int(r.get(rkey("rl", scope, "tpm_sum")) or 0),
        "leases": r.zcard(rkey("rl", scope, "conc")),
        "budget": sum(int(r.get(k) or 0) for k in budgets),
    }


def count_round_trips(limiter: Limiter) -> list[int]:
    """Count the commands the limiter's connection sends that wait for a reply (admissions)."""
    pipe = limiter._lean()
    assert pipe is not None
    sent = [0]
    original = pipe.send

    def counting(*args: Any, **kwargs: Any) -> Any:
        sent[0] += 1
        return original(*args, **kwargs)

    pipe.send = counting  # type: ignore[method-assign]
    return sent


async def serve(limiter: Limiter, info: Any, request_id: str, reserve: int, used: int) -> None:
    """One request admitted and finished, having used `used` of the `reserve` tokens it reserved."""
    admission = await limiter.admit(info, request_id, reserve)
    assert admission is not None
    await limiter.finish(admission, used)


@pytest.mark.parametrize(("clients", "requests", "most_trips"), [(1, 300, 30), (16, 960, 40)])
async def test_a_busy_key_is_admitted_without_a_round_trip_each(
    limiters: Callable[[], Limiter], clients: int, requests: int, most_trips: int
) -> None:
    # With 16 at a time, the next allowance is asked for by one of them when a quarter is left, so the
    # others do not find it spent and go to Redis one by one while the ask is on its way.
    limiter = limiters()
    trips = count_round_trips(limiter)
    info = key_info(**HIGH)
    left = requests

    async def loop(j: int) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            admission = await limiter.admit(info, f"c{j}-{left}", 100)
            assert admission is not None
            await asyncio.sleep(0)
            await limiter.finish(admission, 40)

    await asyncio.gather(*(loop(j) for j in range(clients)))
    assert limiter.granted >= 1
    assert trips[0] <= most_trips, f"{trips[0]} admissions went to Redis for {requests} requests"
    # Settled, Redis counts exactly what was used: every request, 40 tokens each, no lease left.
    limiter.settle_all()
    await asyncio.sleep(0.05)
    assert counted() == {"requests": requests, "tokens": requests * 40, "leases": 0, "budget": requests * 40}


async def test_what_an_allowance_did_not_use_goes_back_when_its_term_ends(
    limiters: Callable[[], Limiter],
) -> None:
    limiter = limiters()
    info = key_info(**HIGH)
    for i in range(3):
        await serve(limiter, info, f"r{i}", 100, 40)
    assert limiter.granted == 1
    during = counted()
    assert during["requests"] > 3 and during["leases"] > 0  # set aside for this process
    await asyncio.sleep(TERM_S + 0.1)  # the term ends with nothing else coming: the timer settles it
    assert counted() == {"requests": 3, "tokens": 120, "leases": 0, "budget": 120}


async def _hammer(limiter: Limiter, info: Any, tag: str, seconds: float, reserve: int, used: int) -> int:
    """Admit and finish as fast as one process can for `seconds`, through refusals: admitted count."""
    admitted = 0
    deadline = time.monotonic() + seconds

    async def loop(j: int) -> None:
        nonlocal admitted
        i = 0
        while time.monotonic() < deadline:
            i += 1
            try:
                admission = await limiter.admit(info, f"{tag}-{j}-{i}", reserve)
            except ProxyError as refused:
                assert refused.status == 429, refused
                await asyncio.sleep(0.01)
                continue
            assert admission is not None
            admitted += 1
            await asyncio.sleep(0)
            await limiter.finish(admission, used)

    await asyncio.gather(*(loop(j) for j in range(8)))
    return admitted


async def _two_processes(limiters: Callable[[], Limiter], info: Any, reserve: int, used: int) -> int:
    """Two limiters (two processes) hammering one key through refusals; what they admitted in all, once
    both have settled what they held."""
    a, b = limiters(), limiters()
    admitted = await asyncio.gather(
        _hammer(a, info, "a", HAMMER_S, reserve, used), _hammer(b, info, "b", HAMMER_S, reserve, used)
    )
    assert a.granted + b.granted >= 2
    a.settle_all()
    b.settle_all()
    await asyncio.sleep(0.05)
    return sum(admitted)


async def test_rpm_is_exact_across_processes_with_allowances(limiters: Callable[[], Limiter]) -> None:
    # 640 a minute leaves room for allowances (a 16th of what is left) until the last few dozen.
    assert await _two_processes(limiters, key_info(requests_per_minute=640), 1, 1) == 640
    assert counted()["requests"] == 640


async def test_tpm_is_exact_across_processes_with_refunds(limiters: Callable[[], Limiter]) -> None:
    # Each request reserves 100 and uses 40: the refunds are spent again, inside the allowance and out.
    # A 32,000-token minute then admits exactly 798: the 799th would need 798 x 40 + 100 > 32,000.
    assert await _two_processes(limiters, key_info(tokens_per_minute=32_000), 100, 40) == 798
    assert counted()["tokens"] == 40 * 798


async def test_concurrency_is_exact_across_processes_with_allowances(limiters: Callable[[], Limiter]) -> None:
    a, b = limiters(), limiters()
    info = key_info(max_concurrent_requests=320)
    held: list[Admission] = []
    deadline = time.monotonic() + HAMMER_S

    async def hold(limiter: Limiter, tag: str) -> None:
        i = 0
        while time.monotonic() < deadline:
            i += 1
            try:
                admission = await limiter.admit(info, f"{tag}{i}", 1)
            except ProxyError as refused:
                assert refused.code == "concurrency_limit_exceeded"
                await asyncio.sleep(0.01)
                continue
            assert admission is not None
            held.append(admission)
            assert len(held) <= 320

    await asyncio.gather(*(hold(lim, f"{n}-{j}-") for n, lim in (("a", a), ("b", b)) for j in range(4)))
    assert a.granted + b.granted >= 2
    assert len(held) == 320
    # Every one still running is a lease in Redis once the allowances are settled; then all go.
    a.settle_all()
    b.settle_all()
    await asyncio.sleep(0.05)
    assert counted()["leases"] == 320
    for admission in held:
        await (a if admission.request_id.startswith("a") else b).finish(admission, 1)
    await asyncio.sleep(0.05)
    assert counted()["leases"] == 0


async def test_a_request_running_when_its_allowance_ends_finishes_as_an_ordinary_one(
    limiters: Callable[[], Limiter],
) -> None:
    limiter = limiters()
    info = key_info(**HIGH)
    first = await limiter.admit(info, "first", 100)
    second = await limiter.admit(info, "second", 100)  # asks, and is granted an allowance
    assert first is not None and second is not None and limiter.granted == 1
    local = await limiter.admit(info, "local", 100)
    assert local is not None and local.allowance is not None
    await limiter.finish(first, 100)
    await limiter.finish(second, 100)
    await asyncio.sleep(TERM_S + 0.1)  # settled while `local` runs: it becomes an ordinary admission
    assert local.allowance is None
    state = counted()
    assert state["leases"] == 1 and state["requests"] == 3
    assert state["tokens"] == 200 + 100 and state["budget"] == 200 + 100
    # Its lease is renewed like any other, and its completion refunds what it did not use.
    r = sync_redis()
    before = r.zscore(rkey("rl", "t1", "conc"), "local")
    assert before is not None
    await asyncio.sleep(0.01)
    await limiter.renew([(rkey("rl", "t1", "conc"), "local")])
    assert (r.zscore(rkey("rl", "t1", "conc"), "local") or 0) > before
    await limiter.finish(local, 30)
    await asyncio.sleep(0.05)  # the completion leaves within FINISH_DELAY_S
    assert counted() == {"requests": 3, "tokens": 230, "leases": 0, "budget": 230}


async def test_near_a_limit_every_admission_goes_to_redis(limiters: Callable[[], Limiter]) -> None:
    limiter = limiters()
    trips = count_round_trips(limiter)
    info = key_info(requests_per_minute=30)  # a 16th of what is left is under 2 requests
    for i in range(30):
        await serve(limiter, info, f"r{i}", 1, 1)
    with pytest.raises(ProxyError):
        await limiter.admit(info, "over", 1)
    assert limiter.granted == 0 and trips[0] == 31


async def test_rare_traffic_gets_no_allowance(limiters: Callable[[], Limiter]) -> None:
    limiter = limiters()
    info = key_info(**HIGH)
    for i in range(3):
        await serve(limiter, info, f"r{i}", 1, 1)
        await asyncio.sleep(2 * TERM_S + 0.05)
    assert limiter.granted == 0


async def test_allowances_can_be_turned_off(redis_clean: None) -> None:
    client = aioredis.Redis.from_url(settings.REDIS_URL)
    limiter = Limiter(client, allowance_ms=0)
    trips = count_round_trips(limiter)
    info = key_info(**HIGH)
    for i in range(20):
        await serve(limiter, info, f"r{i}", 1, 1)
    assert limiter.granted == 0 and trips[0] == 20
    await limiter.aclose()
    await client.aclose()


async def test_redis_gone_admits_only_inside_the_open_term_then_fails_closed() -> None:
    server = PrivateRedis(abrupt=True)
    server.start()
    try:
        client = aioredis.Redis.from_url(server.url, socket_timeout=0.3)
        limiter = Limiter(client)
        info = key_info(**HIGH)
        for i in range(2):
            admission = await limiter.admit(info, f"r{i}", 1)
            assert admission is not None
        assert limiter.granted == 1
        opened = time.monotonic()
        server.stop()
    finally:
        server.close()
    # What Redis set aside is this process's to spend, but only until the term it granted ends.
    assert await limiter.admit(info, "inside", 1) is not None
    assert time.monotonic() - opened < TERM_S
    await asyncio.sleep(TERM_S)
    with pytest.raises(ProxyError) as refused:
        await limiter.admit(info, "after", 1)
    assert refused.value.status == 503 and refused.value.code == "limits_unavailable"
    await limiter.aclose()
    await client.aclose()


async def test_an_admission_run_twice_counts_its_tokens_once(redis_clean: None) -> None:
    # What the pipe does after a lost reply: the same command again, which may already have run.
    client = aioredis.Redis.from_url(settings.REDIS_URL)
    limiter = Limiter(client, allowance_ms=0)
    info = key_info(tokens_per_minute=10_000)
    assert await limiter.admit(info, "same", 100) is not None
    assert await limiter.admit(info, "same", 100) is not None
    assert counted()["tokens"] == 100
    assert sync_redis().zcard(rkey("rl", "t1", "tpm")) == 1
    await limiter.aclose()
    await client.aclose()


async def test_a_grant_run_twice_counts_its_tokens_once(limiters: Callable[[], Limiter]) -> None:
    limiter = limiters()
    info = key_info(tokens_per_minute=10**9)
    for i in range(2):
        assert await limiter.admit(info, f"r{i}", 100) is not None
    assert limiter.granted == 1
    once = counted()["tokens"]
    # The same ask again, under the same allowance id, as a resent command would carry it.
    plan = next(iter(limiter._plans.values()))
    assert plan.allowance is not None
    limiter._aid_next -= 1
    plan.allowance = None
    plan.seen_before = 2  # the same demand as the first ask saw: the same request and token counts
    plan.seen = 0
    assert await limiter.admit(info, "r1-again", 100) is not None
    assert limiter.granted == 2
    assert counted()["tokens"] == once + 100  # the request's own reservation, not the grant's again
