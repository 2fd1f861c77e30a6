"""The model-backed classifier and a remote post-stage on a real llama.cpp engine (SmolLM2-135M, role
cpu-postprocess), with simulators for generation, through the official openai client and the real
proxy: the calls run end to end (what the small model answers is not asserted, only that it answered)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from core.redis_client import publish_config_change
from nodes.models import Deployment
from routing.models import RequestLog, RoutePool, StageChain
from tests.routing.conftest import Proc, make_tenant_key
from tests.routing.fleet import FleetMember, start_member
from tests.routing.test_llamacpp_engine import ALIAS, llama_engine

pytestmark = [pytest.mark.llama, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
__all__ = ["llama_engine"]  # the fixture, shared with the engine's own test


@pytest.fixture
def pools(transactional_db: None) -> Iterator[dict[str, FleetMember]]:
    members = {role: start_member("llama", role=role) for role in ("general", "code")}
    for role in members:
        RoutePool.objects.create(name=role, alias="llama", role=role)
    yield members
    for member in members.values():
        member.sim.stop()


def test_smollm2_labels_prompts_and_rewrites_answers(
    start_proxy: Callable[..., Proc], llama_engine: Deployment, pools: dict[str, FleetMember]
) -> None:
    llama_engine.role = "cpu-postprocess"
    llama_engine.save(update_fields=["role"])
    tk = make_tenant_key("acme")
    StageChain.objects.create(
        name="small",
        alias="llama",
        stages=[
            {
                "kind": "classify",
                "name": "branch",
                "config": {
                    "model": {
                        "pool": ALIAS,
                        "labels": {"code": "code", "chat": "general"},
                        "instruction": "Say code if the message is about programming, else chat.",
                        "timeout_ms": 60_000,
                        "on_failure": "closed",
                    }
                },
            },
            {"kind": "generate", "config": {"pool": "general"}},
            {
                "kind": "remote",
                "name": "tidy",
                "config": {
                    "pool": ALIAS,
                    "instruction": "Repeat the text in one short sentence.",
                    "timeout_ms": 60_000,
                    "on_failure": "closed",
                    "max_tokens": 16,
                },
            },
        ],
    )
    publish_config_change("stage_chain")
    proxy = start_proxy()
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0, timeout=180)
    ask: list[Any] = [{"role": "user", "content": "Why does this Python fail?\ndef f(x):\n    return x +"}]
    reply = client.chat.completions.create(model="llama", messages=ask, max_tokens=8)
    assert reply.choices[0].message.content  # the small model's rewrite (failing closed would be a 503)
    streamed = client.chat.completions.create(model="llama", messages=ask, max_tokens=8, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    deadline = time.monotonic() + 10
    while RequestLog.objects.count() < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    rows = list(RequestLog.objects.order_by("created_at"))
    assert [r.status for r in rows] == [200, 200]
    for row in rows:
        # The model answered: a label (and its pool's engine served it) or no label; and the rewrite ran.
        found = re.match(
            r"chain small v1 \(branch (?:label (\w+) -> (\w+)|no label), tidy rewritten\)", row.route_reason
        )
        assert found, row.route_reason
        assert row.deployment_id == pools[found.group(2) or "general"].deployment.pk
