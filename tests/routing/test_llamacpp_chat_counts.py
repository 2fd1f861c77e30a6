"""The proxy admits a chat prompt with exactly the token count a real llama.cpp engine reports.

llama-cpp-python's server renders the GGUF's own chat template (SmolLM2's adds a default system
prompt when the conversation has none); the proxy reduces that template once to a fixed part and a
part per role. A key limited to one input token makes the proxy say its count in the 400, and the
same conversation sent with an unlimited key gets the engine's usage.prompt_tokens.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import openai
import pytest

from nodes.models import Deployment
from tests.routing.conftest import Proc, make_tenant_key, post
from tests.routing.test_llamacpp_engine import ALIAS, llama_engine  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.llama, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SYSTEM = "You are a terse assistant for a bicycle repair shop. Answer in one sentence."
CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "How do I fix a flat tyre?"}],
    [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What tools do I need?"}],
    [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "My chain skips."},
        {"role": "assistant", "content": "Check the chain for wear and the cassette for worn teeth."},
        {"role": "user", "content": "And if both look fine?\n\nThanks 🚲"},
    ],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Brakes squeal."},
        {"role": "assistant", "content": "Clean the rims and pads with alcohol."},
        {"role": "user", "content": "Still squealing: what next?"},
    ],
]


def test_admitted_count_equals_engine_usage(
    start_proxy: Callable[..., Proc],
    llama_engine: Deployment,  # noqa: F811
) -> None:
    probe = make_tenant_key("probe", max_input_tokens=1)
    tk = make_tenant_key("acme")
    proxy = start_proxy()
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0, timeout=120)
    admitted, engine = [], []
    for messages in CONVERSATIONS:
        body = {"model": ALIAS, "messages": messages}
        # The first one makes the proxy read the GGUF's vocabulary and chat template (seconds on a busy
        # two-core box: the 10 s default timed out once in a loaded CI run), so it may take longer.
        refused = post(proxy.url + "/v1/chat/completions", probe.raw_key, body, timeout=60)
        assert refused.status == 400 and refused.json()["error"]["code"] == "input_tokens_exceeded"
        found = re.search(r"The prompt has (\d+) tokens", refused.json()["error"]["message"])
        assert found is not None
        admitted.append(int(found.group(1)))
        reply = client.chat.completions.create(model=ALIAS, messages=messages, max_tokens=1)  # type: ignore[arg-type]
        assert reply.usage is not None
        engine.append(reply.usage.prompt_tokens)
    assert admitted == engine
