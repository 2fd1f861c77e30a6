"""Limits are exact across proxy processes: three proxies, one RPM budget, exactly N admitted."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
import pytest

from tests.routing.conftest import Proc, make_tenant_key

pytestmark = pytest.mark.django_db(transaction=True)


async def _burst(urls: list[str], key: str, n: int) -> list[tuple[int, dict[str, str]]]:
    body = {"model": "trivial", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:

        async def one(i: int) -> tuple[int, dict[str, str]]:
            async with session.post(urls[i % len(urls)] + "/v1/chat/completions", json=body) as resp:
                await resp.read()
                return resp.status, dict(resp.headers)

        return await asyncio.gather(*(one(i) for i in range(n)))


def test_rpm_exact_across_three_processes(start_proxy: Callable[..., Proc], trivial_backend: Proc) -> None:
    tk = make_tenant_key(requests_per_minute=17)
    proxies = [start_proxy(static=f"trivial={trivial_backend.url}") for _ in range(3)]
    results = asyncio.run(_burst([p.url for p in proxies], tk.raw_key, 60))
    statuses = [s for s, _ in results]
    assert statuses.count(200) == 17
    assert statuses.count(429) == 43
    refused = next(h for s, h in results if s == 429)
    assert int(refused["Retry-After"]) >= 1
    assert refused["x-ratelimit-limit-requests"] == "17"


def test_tpm_exact_across_processes(start_proxy: Callable[..., Proc], trivial_backend: Proc) -> None:
    # Each request reserves 5 prompt tokens (estimate) + 8 max tokens = 13, and the backend reports
    # exactly 13 used, so nothing is refunded: a 40-token minute admits exactly 3, whatever the process.
    tk = make_tenant_key(tokens_per_minute=40)
    proxies = [start_proxy(static=f"trivial={trivial_backend.url}") for _ in range(3)]
    results = asyncio.run(_burst([p.url for p in proxies], tk.raw_key, 30))
    statuses = [s for s, _ in results]
    assert statuses.count(200) == 3 and statuses.count(429) == 27
    refused = next(h for s, h in results if s == 429)
    assert refused["x-ratelimit-limit-tokens"] == "40"
