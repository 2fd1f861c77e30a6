"""A policy's branch rules pick the pool: by task header, tenant, prompt length; else the default."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from routing.models import RequestLog, RoutePolicy, RoutePool
from tests.routing.conftest import Proc, make_tenant_key, post
from tests.routing.fleet import FleetMember, start_member

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fast_and_long(transactional_db: None) -> Iterator[dict[str, FleetMember]]:
    members = {
        "fast": start_member("llama", role="fast", max_model_len=1024),
        "long": start_member("llama", role="long", max_model_len=8192),
    }
    fast = RoutePool.objects.create(name="fast", alias="llama", role="fast")
    long = RoutePool.objects.create(name="long", alias="llama", role="long", scorer="best_fit")
    RoutePolicy.objects.create(
        name="llama-by-shape",
        alias="llama",
        rules=[
            {"match": {"task": ["summarize"]}, "pool": "long"},
            {"match": {"tenant": ["bigco"]}, "pool": "long"},
            {"match": {"max_prompt_tokens": 200}, "pool": "fast"},
        ],
        default_pool=long,
        fallback_pool=fast,
    )
    yield members
    for member in members.values():
        member.sim.stop()


def _send(proxy: Proc, key: str, content: str, headers_task: str | None = None) -> None:
    import json
    import urllib.request

    body = {"model": "llama", "messages": [{"role": "user", "content": content}], "max_tokens": 4}
    req = urllib.request.Request(
        proxy.url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    if headers_task:
        req.add_header("x-task", headers_task)
    with urllib.request.urlopen(req, timeout=20) as resp:
        assert resp.status == 200


def test_rules_pick_pools_in_order(
    start_proxy: Callable[..., Proc], fast_and_long: dict[str, FleetMember]
) -> None:
    acme = make_tenant_key("acme")
    bigco = make_tenant_key("bigco")
    proxy = start_proxy()
    _send(proxy, acme.raw_key, "short question")  # length rule -> fast
    _send(proxy, acme.raw_key, "short question", headers_task="summarize")  # task rule first -> long
    _send(proxy, bigco.raw_key, "short question")  # tenant rule -> long
    _send(proxy, acme.raw_key, "a long document " * 300)  # no rule -> default long
    deadline = time.monotonic() + 5
    while RequestLog.objects.count() < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    rows = list(RequestLog.objects.order_by("id"))
    assert [r.route_pool for r in rows] == ["fast", "long", "long", "long"]
    fast_id = fast_and_long["fast"].deployment.pk
    long_id = fast_and_long["long"].deployment.pk
    assert [r.deployment_id for r in rows] == [fast_id, long_id, long_id, long_id]
    assert "rule 3" in rows[0].route_reason and "rule 1" in rows[1].route_reason
    assert "default" in rows[3].route_reason


def test_batch_requests_are_shed_when_the_pool_is_saturated(
    start_proxy: Callable[..., Proc], fast_and_long: dict[str, FleetMember]
) -> None:
    RoutePool.objects.filter(name="fast").update(max_inflight_per_endpoint=0)
    tk = make_tenant_key()
    proxy = start_proxy()
    body = {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    import json
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        proxy.url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {tk.raw_key}",
            "Content-Type": "application/json",
            "x-priority": "batch",
        },
    )
    with pytest.raises(urllib.error.HTTPError) as shed:
        urllib.request.urlopen(req, timeout=20)
    assert shed.value.code == 429 and shed.value.headers["Retry-After"] == "1"
    # Interactive traffic still goes through on the same saturated pool.
    assert post(proxy.url + "/v1/chat/completions", tk.raw_key, body).status == 200
