"""Concurrent-request leases are exact across proxy processes: slow requests, a burst, N admitted."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
import pytest

from tests.routing.conftest import Proc, make_tenant_key
from tests.routing.fleet import start_member

pytestmark = pytest.mark.django_db(transaction=True)


async def _burst(urls: list[str], key: str, n: int) -> list[int]:
    body = {
        "model": "llama",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 200,
        "ignore_eos": True,
    }
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:

        async def one(i: int) -> int:
            async with session.post(urls[i % len(urls)] + "/v1/chat/completions", json=body) as resp:
                await resp.read()
                return resp.status

        return await asyncio.gather(*(one(i) for i in range(n)))


def test_concurrency_leases_exact_across_processes(
    start_proxy: Callable[..., Proc], transactional_db: None
) -> None:
    # Real-time simulator: each answer takes a few hundred ms, far longer than the burst takes to arrive.
    member = start_member("llama", time_scale=1.0)
    try:
        tk = make_tenant_key(max_concurrent_requests=3)
        proxies = [start_proxy() for _ in range(2)]
        statuses = asyncio.run(_burst([p.url for p in proxies], tk.raw_key, 12))
        assert statuses.count(200) == 3, statuses
        assert statuses.count(429) == 9
        # Leases were released on completion: the next request is admitted.
        assert asyncio.run(_burst([proxies[0].url], tk.raw_key, 1)) == [200]
    finally:
        member.sim.stop()
