"""The Lua limiter against real Redis: sliding windows, TPM reserve and refund, leases, budget, headers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from django.conf import settings

from routing.proxy.errors import ProxyError
from routing.proxy.limits import Limiter
from tests.routing.limits_helpers import key_info


@pytest.fixture
async def limiter(redis_clean: None) -> AsyncIterator[Limiter]:
    client = aioredis.Redis.from_url(settings.REDIS_URL)
    yield Limiter(client, lease_ms=300)
    await client.aclose()


async def test_rpm_admits_exactly_the_limit_then_429_with_retry_after(limiter: Limiter) -> None:
    info = key_info(requests_per_minute=5)
    results = await asyncio.gather(
        *(limiter.admit(info, f"r{i}", 1) for i in range(12)), return_exceptions=True
    )
    admitted = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, ProxyError)]
    assert len(admitted) == 5 and len(refused) == 7
    headers = dict(refused[0].headers)
    assert refused[0].status == 429
    assert 1 <= int(headers[b"retry-after"]) <= 60
    assert headers[b"x-ratelimit-limit-requests"] == b"5"
    assert headers[b"x-ratelimit-remaining-requests"] == b"0"


async def test_tpm_reserves_then_refunds_unused_tokens(limiter: Limiter) -> None:
    info = key_info(tokens_per_minute=100)
    first = await limiter.admit(info, "a", 60)
    assert first is not None
    with pytest.raises(ProxyError) as refused:
        await limiter.admit(info, "b", 60)
    assert refused.value.code == "rate_limit_exceeded"
    await limiter.finish(first, 10)  # used 10 of the 60 reserved: 50 come back
    assert await limiter.admit(info, "c", 60) is not None
    with pytest.raises(ProxyError):
        await limiter.admit(info, "d", 31)  # 10 + 60 used, 30 left


async def test_single_request_over_tpm_is_refused_outright(limiter: Limiter) -> None:
    with pytest.raises(ProxyError) as refused:
        await limiter.admit(key_info(tokens_per_minute=100), "big", 101)
    assert refused.value.code == "tokens_exceeded"


async def test_concurrency_leases_release_and_expire(limiter: Limiter) -> None:
    info = key_info(max_concurrent_requests=2)
    one = await limiter.admit(info, "1", 1)
    assert await limiter.admit(info, "2", 1) is not None
    with pytest.raises(ProxyError) as refused:
        await limiter.admit(info, "3", 1)
    assert refused.value.code == "concurrency_limit_exceeded"
    assert one is not None
    await limiter.finish(one, 1)
    assert await limiter.admit(info, "4", 1) is not None
    # Leases of a proxy that died (never finished, never renewed) lapse after lease_ms.
    await asyncio.sleep(0.4)
    assert await limiter.admit(info, "5", 1) is not None
    assert await limiter.admit(info, "6", 1) is not None


async def test_renewed_lease_outlives_its_first_term(limiter: Limiter) -> None:
    info = key_info(max_concurrent_requests=1)
    held = await limiter.admit(info, "long", 1)
    assert held is not None
    for _ in range(3):
        await asyncio.sleep(0.15)
        await limiter.renew([(k, "long") for k in held.lease_keys])
    with pytest.raises(ProxyError):
        await limiter.admit(info, "other", 1)


async def test_daily_budget_counts_reserved_then_actual_tokens(limiter: Limiter) -> None:
    info = key_info(daily_token_budget=1000)
    a = await limiter.admit(info, "a", 900)
    with pytest.raises(ProxyError) as refused:
        await limiter.admit(info, "b", 200)
    assert refused.value.code == "insufficient_quota"
    assert a is not None
    await limiter.finish(a, 100)
    assert await limiter.admit(info, "c", 800) is not None


async def test_no_counted_limits_means_no_redis_call() -> None:
    class Broken:
        def register_script(self, _src: str) -> None:
            return None

    limiter = Limiter(Broken())  # type: ignore[arg-type]
    assert await limiter.admit(key_info(max_input_tokens=10), "x", 5) is None


async def test_redis_unreachable_fails_closed_with_503() -> None:
    client = aioredis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
    limiter = Limiter(client)
    with pytest.raises(ProxyError) as refused:
        await limiter.admit(key_info(requests_per_minute=10), "x", 1)
    assert refused.value.status == 503 and refused.value.code == "limits_unavailable"
    await client.aclose()


async def test_key_override_and_tenant_limits_both_apply(limiter: Limiter) -> None:
    from dataclasses import replace

    from routing.proxy.config import Limits

    # Tenant allows 10/min across its keys; this key's override allows only 2.
    key_a = replace(key_info(requests_per_minute=10, key_id=1), key_limits=Limits(requests_per_minute=2))
    key_b = key_info(requests_per_minute=10, key_id=2)
    assert await limiter.admit(key_a, "a1", 1) is not None
    assert await limiter.admit(key_a, "a2", 1) is not None
    with pytest.raises(ProxyError):
        await limiter.admit(key_a, "a3", 1)
    # The refused request consumed nothing: the tenant still has 8 left for its other key.
    admitted_b = [await limiter.admit(key_b, f"b{i}", 1) for i in range(8)]
    assert all(a is not None for a in admitted_b)
    with pytest.raises(ProxyError):
        await limiter.admit(key_b, "b9", 1)
