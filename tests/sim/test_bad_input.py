"""Everything vLLM rejects, the simulator rejects the same way: status, OpenAI-shaped body, wording."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.sim.conftest import MODEL
from tests.sim.http import call, call_json
from vllm_sim.testing import SimHandle

CHAT = "/v1/chat/completions"
MSGS = [{"role": "user", "content": "hello"}]


def assert_openai_error(body: Any, status: int, err_type: str, param: str | None) -> str:
    assert list(body) == ["error"]
    err = body["error"]
    assert list(err) == ["message", "type", "param", "code"]
    assert (err["type"], err["param"], err["code"]) == (err_type, param, status)
    return str(err["message"])


def test_unknown_model_is_404(sim: SimHandle) -> None:
    status, body = call_json(sim.base_url + CHAT, {"model": "nope", "messages": MSGS})
    assert status == 404
    msg = assert_openai_error(body, 404, "NotFoundError", "model")
    assert msg == "The model `nope` does not exist."


def test_prompt_over_max_model_len_is_400_even_when_streaming(sim: SimHandle) -> None:
    long = [{"role": "user", "content": " word" * 5000}]
    for stream in (False, True):
        status, body = call_json(sim.base_url + CHAT, {"model": MODEL, "messages": long, "stream": stream})
        assert status == 400
        msg = assert_openai_error(body, 400, "BadRequestError", "input_tokens")
        assert msg.startswith(
            "This model's maximum context length is 4096 tokens. However, you requested 0 output"
        )
        assert "at least 4097 input tokens" in msg and msg.endswith("(parameter=input_tokens, value=4097)")


def test_prompt_plus_max_tokens_over_limit_is_400(sim: SimHandle) -> None:
    prompt = [{"role": "user", "content": " word" * 3900}]
    status, body = call_json(sim.base_url + CHAT, {"model": MODEL, "messages": prompt, "max_tokens": 256})
    msg = assert_openai_error(body, 400, "BadRequestError", "input_tokens")
    assert status == 400 and "you requested 256 output tokens" in msg and "value=3841" in msg


def test_max_tokens_over_max_model_len_is_400(sim: SimHandle) -> None:
    status, body = call_json(sim.base_url + CHAT, {"model": MODEL, "messages": MSGS, "max_tokens": 5000})
    msg = assert_openai_error(body, 400, "BadRequestError", "max_tokens")
    assert status == 400
    assert msg == (
        "max_tokens=5000 cannot be greater than max_model_len=max_total_tokens=4096. "
        "Please request fewer output tokens. (parameter=max_tokens, value=5000)"
    )
    _, body = call_json(
        sim.base_url + CHAT, {"model": MODEL, "messages": MSGS, "max_completion_tokens": 5000}
    )
    assert_openai_error(body, 400, "BadRequestError", "max_completion_tokens")


@pytest.mark.parametrize(
    ("field", "value", "param", "message"),
    [
        (
            "temperature",
            -1,
            "temperature",
            "temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)",
        ),
        (
            "temperature",
            2.5,
            "temperature",
            "temperature must be in [0, 2], got 2.5. (parameter=temperature, value=2.5)",
        ),
        ("top_p", 0, "top_p", "top_p must be in (0, 1], got 0.0. (parameter=top_p, value=0.0)"),
        ("top_p", 1.5, "top_p", "top_p must be in (0, 1], got 1.5. (parameter=top_p, value=1.5)"),
        (
            "max_tokens",
            0,
            "max_tokens",
            "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
        ),
        # vLLM raises these without naming the parameter: param is null, no suffix.
        ("top_k", -5, None, "top_k must be 0 (disable), or at least 1, got -5."),
        ("n", 0, None, "n must be at least 1, got 0."),
        ("presence_penalty", 3, None, "presence_penalty must be in [-2, 2], got 3.0."),
        ("frequency_penalty", -2.5, None, "frequency_penalty must be in [-2, 2], got -2.5."),
        ("repetition_penalty", 0, None, "repetition_penalty must be greater than zero, got 0.0."),
        ("min_p", 2, None, "min_p must be in [0, 1], got 2.0."),
        ("stop", ["", "x"], None, "stop cannot contain an empty string."),
    ],
)
def test_bad_sampling_params_are_400(
    sim: SimHandle, field: str, value: object, param: str | None, message: str
) -> None:
    status, body = call_json(sim.base_url + CHAT, {"model": MODEL, "messages": MSGS, field: value})
    assert status == 400
    assert assert_openai_error(body, 400, "BadRequestError", param) == message


def test_greedy_sampling_allows_one_choice_only(sim: SimHandle) -> None:
    status, body = call_json(
        sim.base_url + CHAT, {"model": MODEL, "messages": MSGS, "temperature": 0, "n": 2}
    )
    assert status == 400
    assert (
        assert_openai_error(body, 400, "BadRequestError", None)
        == "n must be 1 when using greedy sampling, got 2."
    )


def test_logprob_limits(sim: SimHandle) -> None:
    base = {"model": MODEL, "messages": MSGS}
    # Checked by a pydantic model validator: a "Bad Request" whose param comes from the wrapped error.
    status, body = call_json(sim.base_url + CHAT, {**base, "top_logprobs": 3})
    assert status == 400
    msg = assert_openai_error(body, 400, "Bad Request", "top_logprobs")
    assert "when using `top_logprobs`, `logprobs` must be set to true." in msg
    status, body = call_json(sim.base_url + CHAT, {**base, "logprobs": True, "top_logprobs": 21})
    assert status == 400
    assert_openai_error(body, 400, "BadRequestError", "logprobs")
    status, body = call_json(
        sim.base_url + "/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 30}
    )
    assert status == 400


def test_wrong_types_and_missing_fields_are_pydantic_style_400(sim: SimHandle) -> None:
    status, body = call_json(sim.base_url + CHAT, {"model": MODEL, "messages": MSGS, "temperature": "hot"})
    assert status == 400
    msg = assert_openai_error(body, 400, "Bad Request", "body.temperature")
    assert msg.startswith("1 validation error:\n  {'type': 'float_parsing', 'loc': ('body', 'temperature')")
    status, body = call_json(sim.base_url + CHAT, {"model": MODEL})
    assert status == 400 and "'missing'" in assert_openai_error(body, 400, "Bad Request", "body.messages")
    status, body = call_json(sim.base_url + "/v1/completions", {"model": MODEL})
    # `prompt` is optional in vLLM (prompt_embeds is the alternative); its model validator wants one of
    # them non-empty (completion/protocol.py:556-575); the VLLMValidationError names `prompt`, which
    # vLLM's validation handler takes as `param` (handlers/validation.py:100-107).
    msg = assert_openai_error(body, 400, "Bad Request", "prompt")
    assert status == 400 and "Either prompt or prompt_embeds must be provided and non-empty." in msg
    # pydantic's lax mode: numeric strings are numbers.
    ok = call_json(
        sim.base_url + CHAT, {"model": MODEL, "messages": MSGS, "temperature": "0.5", "max_tokens": "2"}
    )
    assert ok[0] == 200


def test_malformed_json_is_400(sim: SimHandle) -> None:
    status, _, raw = call(sim.base_url + CHAT, raw=b'{"model": "x", "messages": [')
    assert status == 400

    body = json.loads(raw)
    assert body["error"]["param"].startswith("body")
    assert "json_invalid" in assert_openai_error(body, 400, "Bad Request", body["error"]["param"])


def test_stream_options_without_stream_is_400(sim: SimHandle) -> None:
    body = {"model": MODEL, "messages": MSGS, "stream_options": {"include_usage": True}}
    status, resp = call_json(sim.base_url + CHAT, body)
    assert status == 400
    msg = assert_openai_error(resp, 400, "Bad Request", "stream_options")
    assert "Stream options can only be defined when `stream=True`." in msg


def test_unknown_route_is_fastapi_404(sim: SimHandle) -> None:
    status, body = call_json(sim.base_url + "/v1/nothing")
    assert (status, body) == (404, {"detail": "Not Found"})
