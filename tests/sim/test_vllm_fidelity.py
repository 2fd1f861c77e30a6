"""Issue 20, items 7-10: the simulator against vLLM's reference (tests/data/vllm/, vLLM @ 2f41c894).

Each test names the vLLM source it checks (file:line as recorded in tests/data/vllm/ or in the issue)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sim.conftest import MODEL, SimFactory
from tests.sim.http import call, call_json
from vllm_sim.testing import SimHandle, start_sim

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSGS = [{"role": "user", "content": "Hello there"}]
KEY = "sk-fid"


@pytest.fixture(scope="module")
def fsim() -> Iterator[SimHandle]:
    """A keyed simulator with dev mode and the optional endpoints/flags turned on, 256-token context."""
    handle = start_sim(
        MODEL,
        "--max-model-len", "256",
        "--enable-server-load-tracking",
        "--enable-tokenizer-info-endpoint",
        "--enable-prompt-tokens-details",
        "--max-logprobs", "-1",
        api_key=KEY, time_scale=50.0, env={"VLLM_SERVER_DEV_MODE": "1"},
    )  # fmt: skip
    yield handle
    handle.stop()


AUTH = {"Authorization": f"Bearer {KEY}"}


def err(body: dict) -> tuple[str, str | None, int, str]:
    e = body["error"]
    assert list(e) == ["message", "type", "param", "code"]
    return e["type"], e["param"], e["code"], e["message"]


# item 7 ------------------------------------------------------------------------------------------------


def test_invocations_is_unguarded_and_dispatches_by_schema(fsim: SimHandle) -> None:
    # endpoints.md: POST /invocations (sagemaker/api_router.py:54-96), not guarded by --api-key.
    s, body = call_json(fsim.base_url + "/invocations", {"messages": MSGS, "max_tokens": 3})
    assert s == 200 and body["object"] == "chat.completion"
    s, body = call_json(fsim.base_url + "/invocations", {"prompt": "Hi", "max_tokens": 3})
    assert s == 200 and body["object"] == "text_completion"
    s, body = call_json(fsim.base_url + "/invocations", {"foo": 1})
    assert s == 400 and err(body)[3].startswith("Cannot find suitable handler for request.")
    # /v1 stays guarded.
    assert call_json(fsim.base_url + CHAT, {"messages": MSGS})[0] == 401


def test_docs_and_openapi(fsim: SimHandle) -> None:
    # FastAPI defaults (launchers/app.py:34-41), unguarded.
    s, spec = call_json(fsim.base_url + "/openapi.json")
    assert s == 200 and {"/v1/chat/completions", "/invocations", "/health"} <= set(spec["paths"])
    s, headers, page = call(fsim.base_url + "/docs")
    assert s == 200 and headers["Content-Type"].startswith("text/html") and b"/openapi.json" in page


def test_docs_gone_with_disable_fastapi_docs(sim_factory: SimFactory) -> None:
    h = sim_factory("--max-model-len", "256", "--disable-fastapi-docs")
    assert call(h.base_url + "/openapi.json")[0] == 404
    assert call(h.base_url + "/docs")[0] == 404
    # /load without --enable-server-load-tracking is always 0 (basic.py:30-50), dev endpoints absent
    # without VLLM_SERVER_DEV_MODE=1 (routers.py:34-37), /tokenizer_info absent without its flag.
    assert call_json(h.base_url + "/load") == (200, {"server_load": 0})
    assert call(h.base_url + "/is_sleeping")[0] == 404
    assert call(h.base_url + "/tokenizer_info")[0] == 404


def test_responses_minimal_shape(fsim: SimHandle) -> None:
    s, body = call_json(
        fsim.base_url + "/v1/responses",
        {"input": "Say hi", "instructions": "Be brief", "max_output_tokens": 4},
        headers=AUTH,
    )
    assert s == 200 and body["object"] == "response" and body["id"].startswith("resp_")
    msg = body["output"][0]
    assert msg["type"] == "message" and msg["role"] == "assistant"
    assert msg["content"][0]["type"] == "output_text" and isinstance(msg["content"][0]["text"], str)
    u = body["usage"]
    assert u["total_tokens"] == u["input_tokens"] + u["output_tokens"] and u["output_tokens"] <= 4


def test_dev_sleep_wake_feeds_sleep_state(fsim: SimHandle) -> None:
    # dev/sleep/api_router.py:21-48; engine_sleep_state (loggers.py L536).
    assert call(fsim.base_url + "/sleep?level=1", method="POST", raw=b"")[0] == 200
    assert call_json(fsim.base_url + "/is_sleeping") == (200, {"is_sleeping": True})
    metrics = call(fsim.base_url + "/metrics")[2].decode()
    assert 'sleep_state="awake"} 0.0' in metrics and 'sleep_state="weights_offloaded"} 1.0' in metrics
    assert call(fsim.base_url + "/wake_up?tags=weights", method="POST", raw=b"")[0] == 200
    assert call_json(fsim.base_url + "/is_sleeping") == (200, {"is_sleeping": True})
    assert call(fsim.base_url + "/wake_up", method="POST", raw=b"")[0] == 200
    assert call_json(fsim.base_url + "/is_sleeping") == (200, {"is_sleeping": False})
    metrics = call(fsim.base_url + "/metrics")[2].decode()
    assert 'sleep_state="awake"} 1.0' in metrics
    assert call(fsim.base_url + "/reset_prefix_cache", method="POST", raw=b"")[0] == 200
    s, _ = call_json(fsim.base_url + CHAT, {"messages": MSGS, "max_tokens": 2}, headers=AUTH)
    assert s == 200


def test_health_503_when_engine_dead(sim_factory: SimFactory) -> None:
    # instrumentator/health.py:22-33: 503 on EngineDeadError.
    h = sim_factory("--max-model-len", "256", "--sim-engine-dead-after", "1")
    assert call_json(h.base_url + CHAT, {"messages": MSGS, "max_tokens": 2})[0] == 200
    assert call(h.base_url + "/health")[0] == 200
    s, body = call_json(h.base_url + CHAT, {"messages": MSGS, "max_tokens": 2})
    assert s == 500 and err(body)[0] == "InternalServerError"
    assert call(h.base_url + "/health")[0] == 503


# item 8 ------------------------------------------------------------------------------------------------


def test_char_length_precheck(fsim: SimHandle) -> None:
    # renderers/params.py:342-370 (_text_len_check), endpoints.md "Very long *text*".
    prompt = "a" * (256 * 19 + 1)
    s, body = call_json(fsim.base_url + COMP, {"prompt": prompt, "max_tokens": 16}, headers=AUTH)
    t, param, _, m = err(body)
    assert (s, t, param) == (400, "BadRequestError", "input_text")
    assert f"your prompt contains {len(prompt)} characters (more than {240 * 19} characters" in m
    assert m.endswith(f"(parameter=input_text, value={len(prompt)})")


def test_prompt_of_exactly_max_model_len_streams_an_error_event(fsim: SimHandle) -> None:
    # v1/engine/input_processor.py:436-480; endpoints.md: streaming gets data: {"error"...} then [DONE].
    probe = call_json(fsim.base_url + "/tokenize", {"messages": [{"role": "user", "content": "x"}]})[1]
    msgs = [{"role": "user", "content": "x" + " x" * (256 - probe["count"])}]
    assert call_json(fsim.base_url + "/tokenize", {"messages": msgs})[1]["count"] == 256
    s, _, raw = call(fsim.base_url + CHAT, {"messages": msgs, "stream": True}, headers=AUTH)
    assert s == 200
    events = [e for e in raw.decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]" and len(events) == 2
    assert events[0].startswith('data: {"error": {"message": "The decoder prompt (length 256)')
    e = json.loads(events[0][6:])["error"]
    assert (e["type"], e["param"], e["code"]) == ("BadRequestError", None, 400)
    s, body = call_json(fsim.base_url + CHAT, {"messages": msgs}, headers=AUTH)
    assert s == 400 and err(body)[3].startswith("The decoder prompt (length 256) plus")


def test_unknown_quantization_fails_at_start(sim_factory: SimFactory) -> None:
    # config/model.py:1326-1331: "Unknown quantization method: X. Must be one of [...]".
    h = sim_factory("--quantization", "bogus", wait=False)
    assert h.proc.wait(20) == 1
    assert "ValueError: Unknown quantization method: bogus. Must be one of ['awq'," in h.log_text()


def test_logit_bias_errors(fsim: SimHandle) -> None:
    url = fsim.base_url + CHAT
    base = {"messages": MSGS, "max_tokens": 2}
    # sampling_params.py:418-443: keys that int() refuses.
    s, body = call_json(url, {**base, "logit_bias": {"abc": 1.0, "5": 2}}, headers=AUTH)
    t, p, _, m = err(body)
    assert (s, t, p) == (400, "BadRequestError", "logit_bias")
    assert m == (
        "logit_bias contains key(s) that cannot be converted to integer token IDs: ['abc'] "
        "(parameter=logit_bias, value=['abc'])"
    )
    # pydantic dict[str, float]: a non-numeric value.
    s, body = call_json(url, {**base, "logit_bias": {"5": "lots"}}, headers=AUTH)
    assert (s, err(body)[0], err(body)[1]) == (400, "Bad Request", "body.logit_bias.5")
    # sampling_params.py:862-880: out of vocabulary.
    s, body = call_json(url, {**base, "logit_bias": {"999999": 1}}, headers=AUTH)
    assert (s, err(body)[1]) == (400, "logit_bias")
    assert err(body)[3].startswith(
        "token_id(s) [999999] in logit_bias contain out-of-vocab token ids. Vocabulary size: 128256"
    )
    assert call_json(url, {**base, "logit_bias": {"100": 5}}, headers=AUTH)[0] == 200


def test_seed_outside_int64(fsim: SimHandle) -> None:
    # chat_completion/protocol.py:231: ge/le of int64.
    s, body = call_json(fsim.base_url + CHAT, {"messages": MSGS, "seed": 2**63}, headers=AUTH)
    t, p, _, m = err(body)
    assert (s, t, p) == (400, "Bad Request", "body.seed")
    assert "'less_than_equal'" in m and "Input should be less than or equal to 9223372036854775807" in m
    assert (
        call_json(fsim.base_url + CHAT, {"messages": MSGS, "seed": 2**63 - 1, "max_tokens": 1}, headers=AUTH)[
            0
        ]
        == 200
    )


def test_seed_just_below_int64_is_refused_not_rounded(fsim: SimHandle) -> None:
    # A JSON parser that reads -2**63 - 1 as a float gets -2**63 back, inside the range; vLLM's reads it
    # exactly (chat_completion/protocol.py:231: ge=_LONG_INFO.min). json.dumps writes every digit.
    s, body = call_json(fsim.base_url + CHAT, {"messages": MSGS, "seed": -(2**63) - 1}, headers=AUTH)
    t, p, _, m = err(body)
    assert (s, t, p) == (400, "Bad Request", "body.seed")
    assert "Input should be greater than or equal to -9223372036854775808" in m
    lowest = {"messages": MSGS, "seed": -(2**63), "max_tokens": 1}
    assert call_json(fsim.base_url + CHAT, lowest, headers=AUTH)[0] == 200


def test_out_of_vocabulary_prompt_ids(fsim: SimHandle) -> None:
    # v1/engine/input_processor.py:533-545.
    s, body = call_json(fsim.base_url + COMP, {"prompt": [100, 200000], "max_tokens": 2}, headers=AUTH)
    assert (s, err(body)[1], err(body)[3]) == (400, None, "Token id 200000 is out of vocabulary")


def test_prompt_logprobs_minus_one_refused_at_default_max_logprobs(sim_factory: SimFactory) -> None:
    # sampling_params.py:852-860: -1 means the whole vocabulary, more than --max-logprobs 20.
    h = sim_factory("--max-model-len", "256")
    s, body = call_json(h.base_url + COMP, {"prompt": "Hi", "max_tokens": 1, "prompt_logprobs": -1})
    assert (s, err(body)[1]) == (400, "prompt_logprobs")
    assert err(body)[3].startswith(
        "Requested prompt logprobs of 128256, which is greater than max allowed: 20"
    )


def test_empty_prompt_wording(fsim: SimHandle) -> None:
    s, body = call_json(fsim.base_url + COMP, {"prompt": "", "max_tokens": 2}, headers=AUTH)
    assert s == 400 and "Either prompt or prompt_embeds must be provided and non-empty." in err(body)[3]


def test_allowed_token_ids_validated(fsim: SimHandle) -> None:
    url = fsim.base_url + COMP
    s, body = call_json(url, {"prompt": "Hi", "allowed_token_ids": []}, headers=AUTH)
    assert (s, err(body)[1]) == (400, "allowed_token_ids")
    assert err(body)[3].startswith("allowed_token_ids is not None and empty!")
    s, body = call_json(url, {"prompt": "Hi", "allowed_token_ids": [5, 999999]}, headers=AUTH)
    assert err(body)[3] == (
        "allowed_token_ids contains out-of-vocab token id! (parameter=allowed_token_ids, value=[999999])"
    )


# item 9 ------------------------------------------------------------------------------------------------


def test_return_tokens_as_token_ids_and_whole_vocab(fsim: SimHandle) -> None:
    s, body = call_json(
        fsim.base_url + CHAT,
        {"messages": MSGS, "max_tokens": 2, "logprobs": True, "top_logprobs": -1,
         "return_tokens_as_token_ids": True},
        headers=AUTH,
    )  # fmt: skip
    assert s == 200
    content = body["choices"][0]["logprobs"]["content"]
    assert all(c["token"].startswith("token_id:") for c in content)
    top = content[0]["top_logprobs"]
    assert len(top) > 20 and all(t["token"].startswith("token_id:") for t in top)


def test_chat_echo_with_continue_final_message(fsim: SimHandle) -> None:
    msgs = [*MSGS, {"role": "assistant", "content": "Sure, the answer is"}]
    body = {"messages": msgs, "max_tokens": 3, "echo": True, "continue_final_message": True,
            "add_generation_prompt": False}  # fmt: skip
    s, out = call_json(fsim.base_url + CHAT, body, headers=AUTH)
    assert s == 200 and out["choices"][0]["message"]["content"].startswith("Sure, the answer is")
    s, _, raw = call(fsim.base_url + CHAT, {**body, "stream": True}, headers=AUTH)
    chunks = [json.loads(e[6:]) for e in raw.decode().split("\n\n") if e and e != "data: [DONE]"]
    assert chunks[1]["choices"][0]["delta"] == {"content": "Sure, the answer is"}
    s, out = call_json(fsim.base_url + CHAT, {**body, "add_generation_prompt": True}, headers=AUTH)
    assert s == 400 and "Cannot set both `continue_final_message` and `add_generation_prompt`" in err(out)[3]


def test_prompt_tokens_details_cached(fsim: SimHandle) -> None:
    prompt = "The same long prefix " * 8
    call_json(fsim.base_url + COMP, {"prompt": prompt, "max_tokens": 1}, headers=AUTH)
    s, body = call_json(fsim.base_url + COMP, {"prompt": prompt, "max_tokens": 1}, headers=AUTH)
    assert s == 200 and body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_prompt_tokens_details_on_a_cold_cache_is_zero_not_null(fsim: SimHandle) -> None:
    # With --enable-prompt-tokens-details vLLM fills the details from num_cached_tokens, 0 included.
    s, body = call_json(fsim.base_url + COMP, {"prompt": "A prompt seen once: 7f3a", "max_tokens": 1},
                        headers=AUTH)  # fmt: skip
    assert s == 200 and body["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


TOOL = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


def test_tool_choice_checks_as_vllm(sim_factory: SimFactory) -> None:
    plain = sim_factory("--max-model-len", "256")
    ask = {"messages": MSGS, "max_tokens": 2}
    # tool_choice defaults to "auto" with tools; without a tool-call parser vLLM refuses it.
    for extra in ({"tools": [TOOL]}, {"tools": [TOOL], "tool_choice": "auto"}):
        s, out = call_json(plain.base_url + CHAT, {**ask, **extra})
        assert s == 400 and err(out)[3] == (
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
        )
    s, out = call_json(plain.base_url + CHAT, {**ask, "tools": [TOOL], "tool_choice": "none"})
    assert s == 200 and out["choices"][0]["message"]["tool_calls"] == []
    s, out = call_json(plain.base_url + CHAT, {**ask, "tool_choice": "required"})
    assert s == 400 and "When using `tool_choice`, `tools` must be set." in err(out)[3]
    named = {"type": "function", "function": {"name": "clock"}}
    s, out = call_json(plain.base_url + CHAT, {**ask, "tools": [TOOL], "tool_choice": named})
    assert s == 400 and "Tool 'clock' has not been passed in `tools`." in err(out)[3]
    served = sim_factory(
        "--max-model-len", "256", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"
    )
    s, out = call_json(served.base_url + CHAT, {**ask, "tools": [TOOL]})
    assert s == 200


def test_vocabulary_size_is_the_served_models(sim_factory: SimFactory, tmp_path: Path) -> None:
    # vLLM bounds token ids by ModelConfig.get_vocab_size(), the model's config.json `vocab_size`
    # (SmolLM2's 49152 here), not one size for every model.
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 49152}))
    for handle in (
        sim_factory("--max-model-len", "256", model=str(tmp_path)),
        sim_factory("--max-model-len", "256", "--sim-vocab-size", "49152"),
    ):
        ask = {"prompt": "Hi", "max_tokens": 2}
        s, out = call_json(handle.base_url + COMP, {**ask, "logit_bias": {"49151": 1, "49152": 1}})
        assert s == 400 and "[49152]" in err(out)[3] and "Vocabulary size: 49152" in err(out)[3]
        s, out = call_json(handle.base_url + COMP, {**ask, "allowed_token_ids": [49151, 49152]})
        assert s == 400 and "out-of-vocab" in err(out)[3]
        s, _ = call_json(handle.base_url + COMP, {**ask, "logit_bias": {"49151": 1}})
        assert s == 200
    # Without either, the profile's model (Llama-3.1-8B: 128256).
    plain = sim_factory("--max-model-len", "256")
    s, _ = call_json(plain.base_url + COMP, {"prompt": "Hi", "max_tokens": 2, "logit_bias": {"128255": 1}})
    assert s == 200


def test_force_include_usage_in_every_chunk(sim_factory: SimFactory) -> None:
    # serve/utils/api_utils.py:289-293.
    h = sim_factory("--max-model-len", "256", "--enable-force-include-usage")
    s, _, raw = call(h.base_url + COMP, {"prompt": "Hi", "max_tokens": 3, "stream": True})
    chunks = [json.loads(e[6:]) for e in raw.decode().split("\n\n") if e and e != "data: [DONE]"]
    assert s == 200 and chunks and all("usage" in c for c in chunks)


# item 10 -----------------------------------------------------------------------------------------------


def test_metrics_waiting_by_reason_iteration_tokens_tokenizer_info(fsim: SimHandle) -> None:
    before = call(fsim.base_url + "/metrics")[2].decode()
    s, _ = call_json(
        fsim.base_url + COMP, {"prompt": [100] * 10, "max_tokens": 3, "ignore_eos": True}, headers=AUTH
    )
    assert s == 200
    m = call(fsim.base_url + "/metrics")[2].decode()
    assert f'vllm:num_requests_waiting_by_reason{{engine="0",model_name="{MODEL}",reason="capacity"}}' in m
    assert 'reason="deferred"} 0.0' in m

    def total(text: str) -> float:
        line = next(x for x in text.splitlines() if x.startswith("vllm:iteration_tokens_total_sum"))
        return float(line.rsplit(" ", 1)[1])

    # loggers.py:1205-1208: 10 prompt tokens computed + 3 generated = 13 (the old count was 12).
    assert total(m) - total(before) == 13
    s, info = call_json(fsim.base_url + "/tokenizer_info")
    assert s == 200 and "tokenizer_class" in info
