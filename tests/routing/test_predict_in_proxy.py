"""The predicted scorers inside the proxy, against simulator engines: the proxy learns every engine from
the streams it completes, decides as least-outstanding does until they are warm, then by prediction,
with the reason in the request log; a batch key's request no engine is predicted to meet is shed, any
other goes to the policy's fallback pool."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable

import pytest

from core.redis_client import publish_config_change
from routing.models import RequestLog, RoutePolicy, RoutePool
from routing.proxy.predict import MIN_SAMPLES
from tests.routing.conftest import Proc, make_tenant_key, post
from tests.routing.fleet import FleetMember, start_member

pytestmark = pytest.mark.django_db(transaction=True)


def stream(proxy: Proc, key: str, words: int) -> int:
    body = {
        "model": "llama",
        "messages": [{"role": "user", "content": "word " * words}],
        "max_tokens": 6,
        "stream": True,
    }
    reply = post(proxy.url + "/v1/chat/completions", key, body, timeout=20)
    return reply.status


def rows(n: int) -> list[RequestLog]:
    deadline = time.monotonic() + 10
    while RequestLog.objects.count() < n and time.monotonic() < deadline:
        time.sleep(0.1)
    return list(RequestLog.objects.order_by("id"))


def warm_up(proxy: Proc, key: str, engines: int) -> int:
    """Enough streams for every engine to pass MIN_SAMPLES (least-outstanding spreads them evenly)."""
    n = engines * (MIN_SAMPLES + 2)
    for i in range(n):
        assert stream(proxy, key, 20 + 40 * (i % 5)) == 200
    return n


def test_predicted_latency_learns_then_predicts(
    start_proxy: Callable[..., Proc], three_sims: list[FleetMember]
) -> None:
    RoutePool.objects.create(name="llama", alias="llama", scorer="predicted_latency")
    tk = make_tenant_key()
    proxy = start_proxy()
    n = warm_up(proxy, tk.raw_key, len(three_sims))
    for _ in range(6):
        assert stream(proxy, tk.raw_key, 50) == 200
    logged = rows(n + 6)
    reasons = [r.route_reason for r in logged]
    assert all("predicted_latency cold least_outstanding" in r for r in reasons[: MIN_SAMPLES * 3 - 3])
    assert all("predicted_latency e2e=" in r for r in reasons[-6:]), reasons[-6:]
    # The cold phase fed every engine.
    assert len({r.deployment_id for r in logged[:n]}) == 3


def test_batch_request_no_engine_can_meet_is_shed(
    start_proxy: Callable[..., Proc], three_sims: list[FleetMember]
) -> None:
    RoutePool.objects.create(name="llama", alias="llama", scorer="slo_cost")
    standard = make_tenant_key()
    batch = make_tenant_key("batchco")
    batch.api_key.slo_class = "batch"
    batch.api_key.save(update_fields=["slo_class"])
    # Targets no engine meets: a standard request still goes (to the fastest), a batch one is shed.
    proxy = start_proxy(PROXY_SLO_BATCH="0.000001/0.000001", PROXY_SLO_STANDARD="0.000001/0.000001")
    n = warm_up(proxy, standard.raw_key, len(three_sims))
    assert stream(proxy, standard.raw_key, 30) == 200
    reply = post(
        proxy.url + "/v1/chat/completions",
        batch.raw_key,
        {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    )
    assert reply.status == 429
    assert reply.json()["error"]["code"] == "slo_shed"
    logged = rows(n + 2)
    assert "slo_cost none_meet fastest" in logged[n].route_reason
    with urllib.request.urlopen(proxy.url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    shed = [line for line in text.splitlines() if line.startswith("inferchain_proxy_slo_requests_total{")]
    assert any('slo_class="batch"' in line and 'outcome="shed"' in line for line in shed), shed
    assert any('slo_class="standard"' in line and 'outcome="missed"' in line for line in shed), shed


def slo_outcomes(proxy: Proc) -> list[str]:
    with urllib.request.urlopen(proxy.url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return [line for line in text.splitlines() if line.startswith("inferchain_proxy_slo_requests_total{")]


def test_a_request_no_engine_of_its_pool_can_meet_goes_to_the_fallback_pool(
    start_proxy: Callable[..., Proc], transactional_db: None, redis_clean: None
) -> None:
    cheap = [start_member("llama", role="cheap") for _ in range(2)]
    spare = start_member("llama", role="spare")
    try:
        home = RoutePool.objects.create(name="cheap", alias="llama", role="cheap", scorer="slo_cost")
        fallback = RoutePool.objects.create(name="spare", alias="llama", role="spare")
        RoutePolicy.objects.create(name="p", alias="llama", default_pool=home, fallback_pool=fallback)
        tk = make_tenant_key()
        # Targets no engine meets: once the cheap pool's engines are warm, a standard request moves.
        proxy = start_proxy(PROXY_SLO_STANDARD="0.000001/0.000001")
        # Cold, slo_cost decides as least-outstanding does, inside its own pool (ties alternate), until
        # both engines have MIN_SAMPLES answers.
        n = MIN_SAMPLES * len(cheap)
        for i in range(n):
            assert stream(proxy, tk.raw_key, 20 + 40 * (i % 5)) == 200
        logged = rows(n)
        assert {r.deployment_id for r in logged} == {m.deployment.pk for m in cheap}
        assert stream(proxy, tk.raw_key, 30) == 200
        moved = rows(n + 1)[-1]
        assert moved.deployment_id == spare.deployment.pk, moved.route_reason
        assert moved.route_pool == "spare"
        assert "slo_cost none_meet in cheap, fallback spare" in moved.route_reason
        assert any('pool="cheap"' in line and 'outcome="fallback"' in line for line in slo_outcomes(proxy))
        # With no engine left in the fallback pool, the request stays home and goes to the soonest there.
        fallback.role = "gone"
        fallback.save()
        publish_config_change("route_pool", id=fallback.pk)  # as the API does; proxies reload within 1 s
        time.sleep(1.0)
        count = RequestLog.objects.count()
        assert stream(proxy, tk.raw_key, 30) == 200
        last = rows(count + 1)[-1]
        assert last.deployment_id in {m.deployment.pk for m in cheap}, last.route_reason
        assert "slo_cost none_meet fastest" in last.route_reason
    finally:
        for member in (*cheap, spare):
            member.sim.stop()
