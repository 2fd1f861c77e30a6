"""The simulator's HTTP surface byte for byte where vLLM's is specified (endpoints.md)."""

from __future__ import annotations

import json

from tests.sim.conftest import MODEL
from tests.sim.http import call, call_json
from vllm_sim.testing import SimHandle


def test_health_is_200_with_empty_body(sim: SimHandle) -> None:
    status, _, body = call(sim.base_url + "/health")
    assert (status, body) == (200, b"")


def test_models_card_fields(sim: SimHandle) -> None:
    status, body = call_json(sim.base_url + "/v1/models")
    assert status == 200 and body["object"] == "list"
    card = body["data"][0]
    assert card["id"] == MODEL and card["object"] == "model" and card["owned_by"] == "vllm"
    assert card["root"] == MODEL and card["parent"] is None
    assert card["max_model_len"] == 4096
    assert card["permission"][0]["object"] == "model_permission"


def test_sse_stream_is_data_lines_ending_with_done(sim: SimHandle) -> None:
    status, headers, body = call(
        sim.base_url + "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    events = [e for e in body.decode().split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4


def test_tokenize_counts_match_usage(sim: SimHandle) -> None:
    messages = [{"role": "user", "content": "How many tokens is this sentence, exactly?"}]
    status, tok = call_json(sim.base_url + "/tokenize", {"model": MODEL, "messages": messages})
    assert status == 200
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 4096
    _, r = call_json(
        sim.base_url + "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 1}
    )
    assert r["usage"]["prompt_tokens"] == tok["count"]
    _, plain = call_json(sim.base_url + "/tokenize", {"prompt": "hello world", "return_token_strs": True})
    assert plain["token_strs"] == ["<|begin_of_text|>", "hello", " world"]
    _, detok = call_json(sim.base_url + "/detokenize", {"tokens": plain["tokens"]})
    assert detok["prompt"] == "<|begin_of_text|>hello world"


def test_tokenize_and_metrics_and_health_are_not_guarded(keyed_sim: SimHandle) -> None:
    assert call(keyed_sim.base_url + "/health")[0] == 200
    assert call(keyed_sim.base_url + "/metrics")[0] == 200
    assert call(keyed_sim.base_url + "/sim/gpu")[0] == 200
    assert call(keyed_sim.base_url + "/tokenize", {"prompt": "x"})[0] == 200


def test_missing_or_wrong_key_is_401_with_vllm_body(keyed_sim: SimHandle) -> None:
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic sk-sim-test-key"}):
        status, hdrs, body = call(keyed_sim.base_url + "/v1/models", headers=headers)
        assert status == 401
        assert body == b'{"error":"Unauthorized"}'
        assert "WWW-Authenticate" not in hdrs
    # Guarded by prefix: an unknown /v1 path is 401 before it is 404.
    assert call(keyed_sim.base_url + "/v1/nothing-here")[0] == 401
    ok = call(keyed_sim.base_url + "/v1/models", headers={"Authorization": "bearer sk-sim-test-key"})
    assert ok[0] == 200


def test_version_and_load(sim: SimHandle) -> None:
    assert "version" in call_json(sim.base_url + "/version")[1]
    assert call_json(sim.base_url + "/load")[1] == {"server_load": 0}


def test_non_streaming_bodies_have_vllms_fields_in_order(sim: SimHandle) -> None:
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    _, chat = call_json(sim.base_url + "/v1/chat/completions", body)
    assert list(chat) == ["id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
                          "usage", "prompt_logprobs", "prompt_token_ids", "kv_transfer_params"]  # fmt: skip
    assert list(chat["choices"][0]) == [
        "index",
        "message",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
    ]
    assert list(chat["usage"]) == [
        "prompt_tokens",
        "total_tokens",
        "completion_tokens",
        "prompt_tokens_details",
    ]
    _, comp = call_json(sim.base_url + "/v1/completions", {"prompt": "x", "max_tokens": 2})
    assert list(comp) == ["id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
                          "usage", "kv_transfer_params"]  # fmt: skip
    assert list(comp["choices"][0]) == ["index", "text", "logprobs", "finish_reason", "stop_reason",
                                        "token_ids", "prompt_logprobs", "prompt_token_ids"]  # fmt: skip
    # `model` may be omitted: the first served name answers.
    assert chat["model"] == comp["model"] == MODEL
