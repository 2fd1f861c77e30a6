"""A classify stage through the official openai client, the real proxy and simulator engines: code, a
keyword, conversation depth and images each send the request to their pool, anything else to the
generate step's pool, and the request log names the matched rule."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from core.redis_client import publish_config_change
from routing.models import RequestLog, RoutePool, StageChain
from tests.routing.conftest import Proc, make_tenant_key
from tests.routing.fleet import FleetMember, start_member

pytestmark = pytest.mark.django_db(transaction=True)

ROLES = ("general", "code", "support", "deep", "vision")


@pytest.fixture
def pools(transactional_db: None) -> Iterator[dict[str, FleetMember]]:
    members = {role: start_member("llama", role=role) for role in ROLES}
    for role in ROLES:
        RoutePool.objects.create(name=role, alias="llama", role=role)
    yield members
    for member in members.values():
        member.sim.stop()


def test_classify_sends_each_request_to_the_pool_its_content_asks_for(
    start_proxy: Callable[..., Proc], pools: dict[str, FleetMember]
) -> None:
    tk = make_tenant_key("acme")
    StageChain.objects.create(
        name="branches",
        alias="llama",
        stages=[
            {
                "kind": "classify",
                "name": "branch",
                "config": {
                    "rules": [
                        {"match": {"code": True}, "pool": "code"},
                        {"match": {"keywords": ["refund", "invoice"]}, "pool": "support"},
                        {"match": {"min_messages": 5}, "pool": "deep"},
                        {"match": {"images": True}, "pool": "vision"},
                    ]
                },
            },
            {"kind": "generate", "config": {"pool": "general"}},
        ],
    )
    publish_config_change("stage_chain")
    proxy = start_proxy()
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0, timeout=30)
    asks: dict[str, Any] = {
        "code": [{"role": "user", "content": "Why does this fail?\ndef f(x):\n    return x +"}],
        "support": [{"role": "user", "content": "Where is my REFUND for last month?"}],
        "deep": [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(5)],
        "vision": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is in this picture?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                ],
            }
        ],
        "general": [{"role": "user", "content": "Tell me about the sea"}],
    }
    for want, messages in asks.items():
        if want == "vision":
            # The simulator is text-only: the engine of the vision pool refuses the image, so the
            # request did reach it.
            with pytest.raises(openai.BadRequestError, match="accepts text only"):
                client.chat.completions.create(model="llama", messages=messages, max_tokens=4)
            continue
        client.chat.completions.create(model="llama", messages=messages, max_tokens=4)
    deadline = time.monotonic() + 10
    while RequestLog.objects.count() < len(asks) and time.monotonic() < deadline:
        time.sleep(0.1)
    rows = list(RequestLog.objects.order_by("created_at"))
    assert [r.deployment_id for r in rows] == [pools[want].deployment.pk for want in asks]
    assert [r.route_pool for r in rows] == list(asks)
    assert rows[0].route_reason.startswith("chain branches v1 (branch rule 1 -> code); chain branch")
    assert rows[2].route_reason.startswith("chain branches v1 (branch rule 3 -> deep)")
    assert rows[4].route_reason.startswith("chain branches v1; chain generate step")
