"""The llama.cpp dialect on its own: what the engine is sent, and its answers made vLLM's (no engine needed;
tests/routing/test_conformance.py runs the same through the proxy against a real llama.cpp engine)."""

from __future__ import annotations

import json

import orjson
import pytest

from routing.proxy.dialect import for_endpoint
from routing.proxy.errors import ProxyError

MSGS = [{"role": "user", "content": "Hi"}]


def sent(body: dict, kind: str = "chat") -> list[dict]:
    dialect = for_endpoint("llamacpp", body, kind, prompt_tokens=7)
    assert dialect is not None
    return [orjson.loads(b) for b in dialect.bodies("served-name")]


def test_vllm_engines_and_the_simulator_get_the_body_as_it_is() -> None:
    assert for_endpoint("vllm", {"messages": MSGS}, "chat", 1) is None
    assert for_endpoint("sim", {"messages": MSGS}, "chat", 1) is None
    assert for_endpoint("llamacpp", {"input": "x"}, "embedding", 1) is None


def test_sampling_defaults_are_vllms_so_temperature_zero_is_greedy() -> None:
    (body,) = sent({"model": "alias", "messages": MSGS, "temperature": 0})
    # llama-cpp-python's own defaults: repeat_penalty 1.1, top_k 40, top_p 0.95, min_p 0.05.
    assert body["repeat_penalty"] == 1.0 and body["top_k"] == 0 and body["top_p"] == 1.0
    assert body["min_p"] == 0.0 and body["temperature"] == 0 and body["model"] == "served-name"
    (body,) = sent({"messages": MSGS})
    assert body["temperature"] == 1.0


def test_vllm_names_are_translated() -> None:
    (body,) = sent(
        {
            "messages": MSGS,
            "max_tokens": 9,
            "max_completion_tokens": 3,
            "repetition_penalty": 1.3,
            "top_k": -1,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    assert body["max_tokens"] == 3 and "max_completion_tokens" not in body
    assert body["repeat_penalty"] == 1.3 and "repetition_penalty" not in body and body["top_k"] == 0
    assert "stream_options" not in body and body["stream"] is True
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    (body,) = sent(
        {"messages": MSGS, "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
    )
    assert body["response_format"] == {"type": "json_object", "schema": schema}


def test_n_is_one_request_per_choice_with_seeds_apart() -> None:
    bodies = sent({"messages": MSGS, "n": 3, "seed": 40})
    assert [b["seed"] for b in bodies] == [40, 41, 42] and all("n" not in b for b in bodies)


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"messages": MSGS, "n": 2, "temperature": 0}, "n", "greedy sampling"),
        ({"messages": MSGS, "top_logprobs": 2}, "top_logprobs", "`logprobs` must be set to true"),
        ({"messages": MSGS, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "max allowed: 20"),
        ({"messages": MSGS, "stream_options": {"include_usage": True}}, "stream_options", "stream=True"),
        (
            {"messages": MSGS, "tools": [{"type": "function", "function": {"name": "f"}}]},
            "tool_choice",
            "auto",
        ),
        ({"messages": MSGS, "use_beam_search": True}, "use_beam_search", "Beam search"),
        ({"messages": MSGS, "best_of": 3}, "best_of", "Beam search"),
        ({"messages": MSGS, "response_format": {"type": "yaml"}}, "response_format", "json_schema"),
    ],
)
def test_what_vllm_refuses_is_refused_naming_the_parameter(body: dict, param: str, words: str) -> None:
    with pytest.raises(ProxyError) as refused:
        for_endpoint("llamacpp", body, "chat", 1)
    assert refused.value.status == 400 and refused.value.param == param and words in refused.value.message


def test_a_whole_answer_gets_vllms_fields_and_exactly_the_top_logprobs_asked() -> None:
    dialect = for_endpoint("llamacpp", {"messages": MSGS, "logprobs": True, "top_logprobs": 1}, "chat", 7)
    assert dialect is not None
    top = [{"token": "b", "logprob": -2.0, "bytes": None}, {"token": "a", "logprob": -0.5, "bytes": None}]
    engine = {
        "id": "x",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "b"},
                "logprobs": {
                    "content": [{"token": "b", "logprob": -2.0, "bytes": None, "top_logprobs": top}],
                    "refusal": None,
                },
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8},
    }
    out = json.loads(dialect.whole([orjson.dumps(engine)]))
    choice = out["choices"][0]
    assert choice["logprobs"] == {
        "content": [
            {
                "token": "b",
                "logprob": -2.0,
                "bytes": [98],
                "top_logprobs": [{"token": "a", "logprob": -0.5, "bytes": [97]}],
            }
        ]
    }
    assert choice["message"]["tool_calls"] == [] and choice["stop_reason"] is None
    assert out["usage"]["prompt_tokens_details"] is None and out["kv_transfer_params"] is None


def test_a_stream_without_usage_gets_the_counted_usage_before_done() -> None:
    dialect = for_endpoint("llamacpp", {"messages": MSGS, "stream": True}, "chat", 7)
    assert dialect is not None

    def chunk(delta: dict, finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice]}
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    # Events arrive in batches of whole events.
    out = dialect.events(chunk({"role": "assistant"}) + chunk({"content": "a"}))
    out += dialect.events(chunk({"content": "b"}) + chunk({}, "length") + b"data: [DONE]\n\n")
    events = [e for e in out.decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    usage = json.loads(events[-2][6:])
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": 7,
        "total_tokens": 9,
        "completion_tokens": 2,
    }
    assert json.loads(events[0][6:])["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_an_engine_validation_500_is_the_clients_400() -> None:
    dialect = for_endpoint("llamacpp", {"messages": MSGS}, "chat", 1)
    assert dialect is not None
    body = {"error": {"message": "1 validation error:\n  {'type': 'x'}\n\n  File \"/srv/app.py\", line 3",
                      "type": "internal_server_error", "param": None, "code": None}}  # fmt: skip
    status, data = dialect.error(500, orjson.dumps(body))
    message = json.loads(data)["error"]["message"]
    assert status == 400 and "1 validation error" in message and "app.py" not in message
    assert dialect.error(500, b'{"error": {"message": "out of memory"}}')[0] == 500
