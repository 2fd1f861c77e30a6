"""One OpenAI API whatever the engine: the same cases through the proxy to every engine kind.

Each case is sent through the proxy, with a tenant's key, to a simulated vLLM engine and to a real llama.cpp
engine (llama-cpp-python's server on the SmolLM2 GGUF). Every case asserts what vLLM answers (status,
shape, counts) and what it saw is compared across the kinds: the same status codes, the same keys in
every object, the same counts. Text differs (two different models), nothing else may. What the proxy does
per kind is in routing/proxy/dialect.py and the table in docs/proxy.md#one-api-whatever-the-engine.

Both engines and the proxy start once and every case runs in one test per kind (an engine start costs
seconds, a case milliseconds); a failure names each case that broke and how.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from nodes.models import Deployment
from tests.routing.conftest import Proc, make_tenant_key, post
from tests.routing.fleet import start_member
from tests.routing.test_llamacpp_engine import ALIAS as LLAMA_ALIAS
from tests.routing.test_llamacpp_engine import llama_engine  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.llama, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SIM_ALIAS = "sim-conformance"
STORY: Any = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]
PROMPT = "Once upon a time, in a village by the sea, there lived"
TOOL: Any = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@dataclass
class Target:
    """One engine kind behind the proxy: the alias that reaches it and how to call it."""

    kind: str
    model: str
    url: str
    key: str
    client: openai.OpenAI

    def raw(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        reply = post(self.url + path, self.key, {"model": self.model, **body}, timeout=120)
        return reply.status, reply.json()

    def stream(self, path: str, body: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
        """A streamed call's chunks, parsed (the last event must be [DONE])."""
        reply = post(self.url + path, self.key, {"model": self.model, "stream": True, **body}, timeout=120)
        if reply.status != 200:
            return reply.status, [reply.json()]
        events = [e for e in reply.text.split("\n\n") if e]
        assert events[-1] == "data: [DONE]", f"the stream did not end with [DONE]: {events[-1:]}"
        return 200, [json.loads(e[6:]) for e in events[:-1]]


CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


def keys(obj: Any) -> list[str]:
    return sorted(obj) if isinstance(obj, dict) else []


def shape(answer: dict[str, Any], box: str) -> dict[str, list[str]]:
    """The keys of every object in a whole answer: what must be the same for every engine kind."""
    choice = answer["choices"][0]
    out = {"answer": keys(answer), "choice": keys(choice), "usage": keys(answer.get("usage"))}
    if box == "message":
        out["message"] = keys(choice["message"])
    return out


def usage_chunks(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in chunks if c.get("usage")]


def choice_text(chunks: list[dict[str, Any]], index: int = 0) -> str:
    parts = []
    for c in chunks:
        for choice in c.get("choices") or []:
            if choice["index"] == index:
                parts.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
    return "".join(parts)


# Each case: what vLLM answers is asserted; the dict it returns is compared across engine kinds.


def chat_whole(t: Target) -> dict[str, Any]:
    status, body = t.raw(CHAT, {"messages": STORY, "max_tokens": 5, "temperature": 0})
    assert status == 200, body
    usage = body["usage"]
    assert usage["completion_tokens"] == 5 and usage["total_tokens"] == usage["prompt_tokens"] + 5
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["choices"][0]["message"]["tool_calls"] == []
    return {"shape": shape(body, "message"), "finish": body["choices"][0]["finish_reason"]}


def completion_whole(t: Target) -> dict[str, Any]:
    status, body = t.raw(COMPLETIONS, {"prompt": PROMPT, "max_tokens": 5, "temperature": 0})
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 5 and body["choices"][0]["finish_reason"] == "length"
    return {"shape": shape(body, "text")}


def max_completion_tokens(t: Target) -> dict[str, Any]:
    reply = t.client.chat.completions.create(
        model=t.model,
        messages=STORY,
        max_completion_tokens=5,
        temperature=0,
    )
    assert reply.usage is not None and reply.usage.completion_tokens == 5
    assert reply.choices[0].finish_reason == "length"
    # Both names at once: max_completion_tokens wins, as in vLLM.
    status, body = t.raw(
        CHAT, {"messages": STORY, "max_tokens": 9, "max_completion_tokens": 3, "temperature": 0}
    )
    assert status == 200 and body["usage"]["completion_tokens"] == 3
    return {"completion_tokens": [5, body["usage"]["completion_tokens"]]}


def stream_without_usage(t: Target) -> dict[str, Any]:
    status, chunks = t.stream(CHAT, {"messages": STORY, "max_tokens": 5, "temperature": 0})
    assert status == 200
    assert not usage_chunks(chunks), "usage sent to a client that did not ask for it"
    first = chunks[0]["choices"][0]["delta"]
    assert first == {"role": "assistant", "content": ""}, first
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert choice_text(chunks)
    return {"usage_chunks": 0, "first_delta": sorted(first)}


def stream_with_usage(t: Target) -> dict[str, Any]:
    _, whole = t.raw(CHAT, {"messages": STORY, "max_tokens": 5, "temperature": 0})
    chunks = list(
        t.client.chat.completions.create(
            model=t.model,
            messages=STORY,
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    with_usage = [c for c in chunks if c.usage is not None]
    assert len(with_usage) == 1 and with_usage[0] is chunks[-1] and chunks[-1].choices == []
    usage = chunks[-1].usage
    assert usage is not None
    # The same tokens as the same request not streamed.
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        whole["usage"]["prompt_tokens"],
        whole["usage"]["completion_tokens"],
    )
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    _, raw = t.stream(
        COMPLETIONS, {"prompt": PROMPT, "max_tokens": 4, "stream_options": {"include_usage": True}}
    )
    done = usage_chunks(raw)
    assert len(done) == 1 and done[0]["choices"] == [] and done[0]["usage"]["completion_tokens"] == 4
    return {"usage_chunks": [len(with_usage), len(done)], "usage_keys": keys(done[0]["usage"])}


def n_choices(t: Target) -> dict[str, Any]:
    reply = t.client.chat.completions.create(
        model=t.model,
        messages=STORY,
        max_tokens=4,
        n=2,
        temperature=1.0,
        seed=7,
    )
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.usage is not None and reply.usage.completion_tokens == 8
    status, chunks = t.stream(
        CHAT,
        {"messages": STORY, "max_tokens": 4, "n": 2, "seed": 7, "stream_options": {"include_usage": True}},
    )
    assert status == 200
    finished = sorted(
        c["choices"][0]["index"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]
    )
    assert finished == [0, 1] and choice_text(chunks, 0) and choice_text(chunks, 1)
    assert [u["usage"]["completion_tokens"] for u in usage_chunks(chunks)] == [8]
    status, body = t.raw(COMPLETIONS, {"prompt": PROMPT, "max_tokens": 3, "n": 3, "temperature": 1.0})
    assert status == 200 and [c["index"] for c in body["choices"]] == [0, 1, 2]
    # vLLM refuses several greedy choices (they would all be the same).
    status, body = t.raw(CHAT, {"messages": STORY, "max_tokens": 4, "n": 2, "temperature": 0})
    assert status == 400 and "n must be 1 when using greedy sampling" in body["error"]["message"]
    return {"choices": [2, 3], "greedy_n": status}


def stop(t: Target) -> dict[str, Any]:
    _, body = t.raw(CHAT, {"messages": STORY, "max_tokens": 12, "temperature": 0})
    text = body["choices"][0]["message"]["content"]
    # A stop string from the middle of the greedy answer: the same answer cut before it.
    cut = next(i for i in range(3, len(text)) if not text[i].isspace())
    word = text[cut : cut + 2]
    status, body = t.raw(CHAT, {"messages": STORY, "max_tokens": 12, "temperature": 0, "stop": [word]})
    assert status == 200
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and text.startswith(choice["message"]["content"])
    assert word not in choice["message"]["content"]
    return {"finish": choice["finish_reason"]}


def logprobs(t: Target) -> dict[str, Any]:
    reply = t.client.chat.completions.create(
        model=t.model,
        messages=STORY,
        max_tokens=3,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = reply.choices[0].logprobs.content if reply.choices[0].logprobs else None
    assert content is not None and len(content) == 3
    for entry in content:
        assert len(entry.top_logprobs) == 2, entry.top_logprobs  # exactly what was asked
        assert entry.bytes == list(entry.token.encode())
        top = [x.logprob for x in entry.top_logprobs]
        assert top == sorted(top, reverse=True) and entry.logprob <= top[0] + 1e-6
    status, body = t.raw(COMPLETIONS, {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "logprobs": 2})
    lp = body["choices"][0]["logprobs"]
    assert status == 200 and len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 3
    # The top 2 and, as vLLM does for completions, the sampled token when it is not among them.
    assert all(2 <= len(top) <= 3 for top in lp["top_logprobs"])
    return {"chat_entry": sorted(content[0].model_dump()), "completion_logprobs": keys(lp)}


def seed(t: Target) -> dict[str, Any]:
    ask = {"messages": STORY, "max_tokens": 8, "temperature": 1.0, "seed": 1234}
    texts = [t.raw(CHAT, ask)[1]["choices"][0]["message"]["content"] for _ in range(2)]
    assert texts[0] == texts[1], texts  # the same seed, the same sample
    return {"same": True}


def response_format(t: Target) -> dict[str, Any]:
    out: dict[str, Any] = {}
    formats: list[dict[str, Any]] = [
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "city", "schema": TOOL["function"]["parameters"]}},
    ]
    for fmt in formats:
        status, body = t.raw(CHAT, {"messages": STORY, "max_tokens": 5, "response_format": fmt})
        assert status == 200, body
        out[fmt["type"]] = status
    status, body = t.raw(CHAT, {"messages": STORY, "max_tokens": 5, "response_format": {"type": "yaml"}})
    assert status == 400, body
    out["yaml"] = status
    return out


def tools(t: Target) -> dict[str, Any]:
    # No tool-call parser on either engine: "auto" (the default with tools) is refused as vLLM refuses it.
    seen = {}
    for extra in ({"tools": [TOOL]}, {"tools": [TOOL], "tool_choice": "auto"}):
        status, body = t.raw(CHAT, {"messages": STORY, "max_tokens": 3, **extra})
        assert status == 400 and "--enable-auto-tool-choice" in body["error"]["message"], body
        seen[str(extra.get("tool_choice"))] = status
    status, body = t.raw(CHAT, {"messages": STORY, "max_tokens": 3, "tools": [TOOL], "tool_choice": "none"})
    assert status == 200 and body["choices"][0]["message"]["tool_calls"] == []
    seen["none"] = status
    named = {"type": "function", "function": {"name": "clock"}}
    status, body = t.raw(CHAT, {"messages": STORY, "max_tokens": 3, "tools": [TOOL], "tool_choice": named})
    assert status == 400 and "Tool 'clock' has not been passed in `tools`." in body["error"]["message"]
    seen["unknown"] = status
    return seen


def errors(t: Target) -> dict[str, Any]:
    seen = {}
    cases: dict[str, tuple[str, dict[str, Any]]] = {
        "unknown_model": (CHAT, {"model": "no-such-model", "messages": STORY}),
        "too_long": (CHAT, {"messages": [{"role": "user", "content": "word " * 3000}]}),
        "temperature": (CHAT, {"messages": STORY, "temperature": 3}),
        "max_tokens_type": (CHAT, {"messages": STORY, "max_tokens": "x"}),
        "top_logprobs_without_logprobs": (CHAT, {"messages": STORY, "top_logprobs": 2}),
        "top_logprobs_above_max": (CHAT, {"messages": STORY, "logprobs": True, "top_logprobs": 21}),
        "stream_options_without_stream": (
            CHAT,
            {"messages": STORY, "stream_options": {"include_usage": True}},
        ),
        "empty_prompt": (COMPLETIONS, {"prompt": ""}),
    }
    for name, (path, body) in cases.items():
        reply = post(t.url + path, t.key, {"model": t.model, **body}, timeout=60)
        error = reply.json().get("error")
        assert isinstance(error, dict) and keys(error) == ["code", "message", "param", "type"], (
            name,
            reply.text,
        )
        seen[name] = reply.status
    assert seen["unknown_model"] == 404
    assert all(status == 400 for name, status in seen.items() if name != "unknown_model"), json.dumps(seen)
    return seen


CASES: list[Callable[[Target], dict[str, Any]]] = [
    chat_whole,
    completion_whole,
    max_completion_tokens,
    stream_without_usage,
    stream_with_usage,
    n_choices,
    stop,
    logprobs,
    seed,
    response_format,
    tools,
    errors,
]


def run_cases(target: Target) -> tuple[dict[str, dict[str, Any]], list[str]]:
    seen: dict[str, dict[str, Any]] = {}
    failed: list[str] = []
    for case in CASES:
        try:
            seen[case.__name__] = case(target)
        except Exception as exc:  # every case runs; the test fails naming each one that broke
            failed.append(f"{case.__name__} on {target.kind}: {type(exc).__name__}: {exc}")
    return seen, failed


@pytest.fixture
def targets(
    start_proxy: Callable[..., Proc],
    llama_engine: Deployment,  # noqa: F811
) -> Iterator[dict[str, Target]]:
    member = start_member(SIM_ALIAS, max_model_len=2048)
    try:
        key = make_tenant_key("conformance", requests_per_minute=10_000).raw_key
        proxy = start_proxy()
        yield {
            kind: Target(
                kind,
                model,
                proxy.url,
                key,
                openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0, timeout=120),
            )
            for kind, model in (("sim", SIM_ALIAS), ("llamacpp", LLAMA_ALIAS))
        }
    finally:
        member.sim.stop()


def test_every_engine_kind_answers_as_vllm(targets: dict[str, Target]) -> None:
    seen: dict[str, dict[str, dict[str, Any]]] = {}
    failed: list[str] = []
    for kind, target in targets.items():
        seen[kind], broke = run_cases(target)
        failed += broke
    for case in CASES:
        name = case.__name__
        found = {kind: seen[kind].get(name) for kind in targets}
        if (
            all(v is not None for v in found.values())
            and len({json.dumps(v, sort_keys=True) for v in found.values()}) > 1
        ):
            failed.append(f"{name} differs between engine kinds: {found}")
    assert not failed, "\n".join(failed)
