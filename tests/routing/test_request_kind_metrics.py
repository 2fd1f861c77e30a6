"""The proxy's per-request metrics by pool and request kind (short or long prompt), by tenant and by
deployment (issue 21 item 1): what docs/monitoring.md lists, with the values one request of each kind
leaves in the exposition."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from routing.models import RoutePolicy, RoutePool
from tests.routing.conftest import Proc, make_tenant_key, post
from tests.routing.fleet import FleetMember, start_member

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def member(transactional_db: None, redis_clean: None) -> Iterator[FleetMember]:
    started = start_member("llama", max_model_len=8192)
    chat = RoutePool.objects.create(name="chat", alias="llama")
    RoutePolicy.objects.create(name="llama", alias="llama", default_pool=chat)
    yield started
    started.sim.stop()


def samples(proxy: Proc) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = urllib.request.urlopen(proxy.url + "/metrics", timeout=5).read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_success_and_latency_by_pool_length_tenant_and_deployment(
    start_proxy: Callable[..., Proc], member: FleetMember
) -> None:
    acme = make_tenant_key("acme")
    proxy = start_proxy(PROXY_LONG_PROMPT_TOKENS="200")
    url = proxy.url + "/v1/chat/completions"

    def ask(content: str) -> None:
        body = {"model": "llama", "messages": [{"role": "user", "content": content}], "max_tokens": 4}
        assert post(url, acme.raw_key, body).status == 200

    ask("a short question")
    ask("a long document " * 150)  # about 450 prompt tokens: "long" against a 200-token threshold
    bad = urllib.request.Request(
        url, data=json.dumps({"model": "llama"}).encode(), headers={"Authorization": "Bearer nope"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(bad, timeout=10)
    assert refused.value.code == 401

    got = samples(proxy)

    def value(name: str, **labels: str) -> float:
        return got.get((name, frozenset(labels.items())), 0.0)

    for length in ("short", "long"):
        assert value("inferchain_proxy_pool_requests_total", pool="chat", length=length, code="2xx") == 1.0
        assert value("inferchain_proxy_pool_request_seconds_count", pool="chat", length=length) == 1.0
        assert value("inferchain_proxy_pool_request_seconds_sum", pool="chat", length=length) > 0
    assert value("inferchain_proxy_tenant_requests_total", tenant="acme", code="2xx") == 2.0
    assert value("inferchain_proxy_tenant_request_seconds_count", tenant="acme") == 2.0
    assert value("inferchain_proxy_tenant_tokens_total", tenant="acme", kind="completion") > 0
    assert value("inferchain_proxy_tenant_tokens_total", tenant="acme", kind="prompt") > 400
    # Refused before a key was known: counted for tenant "", not for any pool.
    assert value("inferchain_proxy_tenant_requests_total", tenant="", code="4xx") == 1.0
    pools = {
        dict(labels).get("pool") for name, labels in got if name == "inferchain_proxy_pool_requests_total"
    }
    assert pools == {"chat"}
    deployment = str(member.deployment.pk)
    assert value("inferchain_proxy_requests_total", alias="llama", deployment=deployment, status="200") == 2.0
    assert value("inferchain_proxy_request_seconds_count", alias="llama", deployment=deployment) == 2.0
