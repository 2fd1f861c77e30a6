"""The proxy's context check counts the requested output as vLLM does: prompt + max_tokens over
max_model_len is refused before any engine, with the status and message the engine itself would give."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from routing.models import RequestLog
from tests.routing.conftest import Proc, make_tenant_key, post
from tests.routing.fleet import FleetMember, sim_conversation, start_member
from vllm_sim import text

pytestmark = pytest.mark.django_db(transaction=True)

MAX_MODEL_LEN = 4096


@pytest.fixture
def member(transactional_db: None, redis_clean: None) -> Iterator[FleetMember]:
    found = start_member("llama", max_model_len=MAX_MODEL_LEN)
    yield found
    found.sim.stop()


def _engine_error(member: FleetMember, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    reply = post(member.sim.base_url + path, member.sim.api_key, body)
    return reply.status, reply.json()["error"]


def test_prompt_plus_max_tokens_over_max_model_len_is_refused_as_the_engine_would(
    start_proxy: Callable[..., Proc], member: FleetMember
) -> None:
    tk = make_tenant_key()
    proxy = start_proxy()
    messages = sim_conversation(3000)
    cases: list[tuple[str, dict[str, Any]]] = [
        ("/v1/chat/completions", {"model": "llama", "messages": messages, "max_tokens": 1200}),
        ("/v1/chat/completions", {"model": "llama", "messages": messages, "max_completion_tokens": 5000}),
        ("/v1/chat/completions", {"model": "llama", "messages": sim_conversation(MAX_MODEL_LEN)}),
        ("/v1/completions", {"model": "llama", "prompt": [7] * 4000, "max_tokens": 200}),
    ]
    for path, body in cases:
        reply = post(proxy.url + path, tk.raw_key, body)
        assert reply.status == 400, reply.text
        error = reply.json()["error"]
        assert error["code"] == "context_length_exceeded"
        engine_status, engine_error = _engine_error(member, path, body)
        assert (engine_status, engine_error["message"], engine_error["param"]) == (
            400,
            error["message"],
            error["param"],
        )
    # Within the context it reaches the engine: 3000 + 1000 fits 4096.
    ok = post(
        proxy.url + "/v1/chat/completions",
        tk.raw_key,
        {"model": "llama", "messages": messages, "max_tokens": 1000},
    )
    assert ok.status == 200, ok.text
    deadline = time.monotonic() + 5
    while RequestLog.objects.count() < len(cases) + 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    rows = list(RequestLog.objects.order_by("id"))
    assert [r.deployment_id for r in rows] == [None] * len(cases) + [member.deployment.pk]
    assert text.chat_prompt_tokens(messages) == ok.json()["usage"]["prompt_tokens"] == 3000
