"""Scorers at work inside the proxy, against simulator engines and live KV state in Redis."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable

import pytest

from core.redis_client import get_redis
from core.redis_client import key as rkey
from routing.models import RequestLog, RoutePool
from tests.routing.conftest import Proc, make_tenant_key
from tests.routing.fleet import FleetMember

pytestmark = pytest.mark.django_db(transaction=True)


def _chat(proxy: Proc, key: str, content: str, headers: dict[str, str] | None = None) -> None:
    body = {"model": "llama", "messages": [{"role": "user", "content": content}], "max_tokens": 4}
    req = urllib.request.Request(
        proxy.url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json", **(headers or {})},
    )
    with urllib.request.urlopen(req, timeout=20) as resp:
        assert resp.status == 200


def _rows(n: int) -> list[RequestLog]:
    deadline = time.monotonic() + 5
    while RequestLog.objects.count() < n and time.monotonic() < deadline:
        time.sleep(0.1)
    return list(RequestLog.objects.order_by("id"))


def test_prefix_affinity_keeps_a_shared_prefix_on_one_engine(
    start_proxy: Callable[..., Proc], three_sims: list[FleetMember]
) -> None:
    RoutePool.objects.create(name="llama", alias="llama", scorer="prefix_affinity")
    tk = make_tenant_key()
    proxy = start_proxy()
    system = "You are a meticulous assistant for the ACME support desk. " * 30
    for i in range(5):
        _chat(proxy, tk.raw_key, system + f"question number {i}")
    for i in range(12):
        _chat(proxy, tk.raw_key, f"{i} unrelated prompt " * 20)
    rows = _rows(17)
    assert len({r.deployment_id for r in rows[:5]}) == 1
    assert len({r.deployment_id for r in rows[5:]}) >= 2
    assert all("prefix_affinity" in r.route_reason for r in rows)


def test_session_affinity_by_header(start_proxy: Callable[..., Proc], three_sims: list[FleetMember]) -> None:
    RoutePool.objects.create(name="llama", alias="llama", scorer="session_affinity")
    tk = make_tenant_key()
    proxy = start_proxy()
    for i in range(4):
        _chat(proxy, tk.raw_key, f"turn {i}", {"x-session-id": "user-42"})
    rows = _rows(4)
    assert len({r.deployment_id for r in rows}) == 1


def test_best_fit_uses_live_kv_state_and_treats_stale_as_busy(
    start_proxy: Callable[..., Proc], three_sims: list[FleetMember]
) -> None:
    RoutePool.objects.create(name="llama", alias="llama", scorer="best_fit")
    tk = make_tenant_key()
    # Samples older than 1 s count as missing here (PROXY_LIVE_STALE_SECONDS; 2.5 agent periods by
    # default), so the stale case below needs only a short wait.
    proxy = start_proxy(PROXY_LIVE_STALE_SECONDS="1")
    r = get_redis()
    usage = {0: 0.5, 1: 0.99995, 2: 0.2}  # of 100,000 tokens: free 50,000 / 5 / 80,000

    def publish(ts: float) -> None:
        for i, member in enumerate(three_sims):
            live = {"ts": ts, "kv_cache_usage_perc": usage[i], "kv_cache_total_tokens": 100_000}
            r.set(rkey("live", "deployment", str(member.deployment.pk)), json.dumps(live))

    # The request reserves about 12 tokens (prompt + 4 max tokens): engine 1 is too full, engine 0 fits
    # with the least left over.
    for _ in range(3):
        publish(time.time())
        time.sleep(0.3)  # the proxy polls live state every 250 ms
        _chat(proxy, tk.raw_key, "short question")
    # No fresh sample for over a second (an agent that stopped reporting; an older sample does not
    # replace a newer one): stale counts as busy.
    publish(time.time() - 10)
    time.sleep(1.2)
    _chat(proxy, tk.raw_key, "short question")
    rows = _rows(4)
    assert [r.deployment_id for r in rows[:3]] == [three_sims[0].deployment.pk] * 3
    assert "leftover=" in rows[0].route_reason
    assert "no_live_state" in rows[3].route_reason
