"""A classify stage backed by a small model on a CPU pool, through the official openai client, the real
proxy, simulator engines for generation and a controllable CPU engine: the model's label sends the
request to its pool (a rule that matches first saves the call), a reply with no label and a slow engine
(failing open) leave the generate step's pool, and the request log names the label or the failure."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import openai
import pytest

from core.redis_client import publish_config_change
from routing.models import RequestLog, RoutePool, StageChain
from tests.routing.conftest import Proc, make_tenant_key
from tests.routing.cpu_engine import cpu_engine
from tests.routing.fleet import FleetMember, start_member

pytestmark = pytest.mark.django_db(transaction=True)

ROLES = ("general", "code", "support")


@pytest.fixture
def pools(transactional_db: None) -> Iterator[dict[str, FleetMember]]:
    members = {role: start_member("llama", role=role) for role in ROLES}
    for role in ROLES:
        RoutePool.objects.create(name=role, alias="llama", role=role)
    yield members
    for member in members.values():
        member.sim.stop()


def label(system: str, user: str) -> str:
    if "def " in user:
        return "Code."
    if "weather" in user:
        return "I cannot tell."
    return "chat"


def test_the_models_label_picks_the_pool(
    start_proxy: Callable[..., Proc], pools: dict[str, FleetMember], transactional_db: None
) -> None:
    tk = make_tenant_key("acme")
    with cpu_engine() as cpu:
        cpu.reply = label
        StageChain.objects.create(
            name="smart",
            alias="llama",
            stages=[
                {
                    "kind": "classify",
                    "name": "branch",
                    "config": {
                        "rules": [{"match": {"keywords": ["refund"]}, "pool": "support"}],
                        "model": {
                            "pool": "cpu",
                            "labels": {"code": "code", "chat": "general"},
                            "instruction": "Is this about programming?",
                            "timeout_ms": 400,
                        },
                    },
                },
                {"kind": "generate", "config": {"pool": "general"}},
            ],
        )
        publish_config_change("stage_chain")
        proxy = start_proxy()
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0, timeout=30)
        asks = [
            ("code", "Why does this fail?\ndef f(x):\n    return x +"),
            ("general", "Tell me about the sea"),
            ("support", "Where is my refund?"),  # the rule matches: no model call
            ("general", "What is the weather like?"),  # no label in the reply
        ]
        for _, content in asks:
            client.chat.completions.create(
                model="llama", messages=[{"role": "user", "content": content}], max_tokens=4
            )
        assert len(cpu.requests) == 3
        first = cpu.requests[0]
        assert first["temperature"] == 0 and first["max_tokens"] == 8
        assert first["messages"][0]["content"].startswith("Is this about programming?")
        # The labels, in the order the database keeps them (jsonb sorts keys).
        assert "exactly one of these labels: chat, code." in first["messages"][0]["content"]
        assert first["messages"][1]["content"] == asks[0][1]
        cpu.delay_s = 2.0
        started = time.monotonic()
        client.chat.completions.create(
            model="llama", messages=[{"role": "user", "content": "def g(): pass"}], max_tokens=4
        )
        assert time.monotonic() - started < 1.8  # the stage's 400 ms, not the engine's 2 s
    want = [pool for pool, _ in asks] + ["general"]
    deadline = time.monotonic() + 10
    while RequestLog.objects.count() < len(want) and time.monotonic() < deadline:
        time.sleep(0.1)
    rows = list(RequestLog.objects.order_by("created_at"))
    assert [r.route_pool for r in rows] == want
    assert [r.deployment_id for r in rows] == [pools[p].deployment.pk for p in want]
    reasons = [r.route_reason for r in rows]
    assert reasons[0].startswith("chain smart v1 (branch label code -> code); chain branch")
    assert reasons[1].startswith("chain smart v1 (branch label chat -> general); chain branch")
    assert reasons[2].startswith("chain smart v1 (branch rule 1 -> support)")
    assert reasons[3].startswith("chain smart v1 (branch no label); chain generate step")
    assert reasons[4].startswith("chain smart v1 (branch timeout, failed open); chain generate step")
