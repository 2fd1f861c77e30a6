"""Everything vLLM rejects, the simulator rejects the same way: status, OpenAI-shaped body, wording."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nodes.sim.testing import SimHandle
from tests.sim.conftest import MODEL
from tests.sim.http import call, call_json

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
    ("field", "value", "fragment"),
    [
        ("temperature", -1, "temperature must be non-negative, got -1.0."),
        ("top_p", 0, "top_p must be in (0, 1], got 0.0."),
        ("top_p", 1.5, "top_p must be in (0, 1], got 1.5."),
        ("top_k", -5, "top_k must be 0 (disable), or at least 1, got -5."),
        ("n", 0, "n must be at least 1, got 0."),
        ("presence_penalty", 3, "presence_penalty must be in [-2, 2], got 3.0."),
        ("frequency_penalty", -2.5, "frequency_penalty must be in [-2, 2], got -2.5."),
        ("repetition_penalty", 0, "repetition_penalty must be greater than zero, got 0.0."),
        ("max_tokens", 0, "max_tokens must be at least 1, got 0."),
        ("min_p", 2, "min_p must be in [0, 1], got 2.0."),
    ],
)
def test_bad_sampling_params_are_400(sim: SimHandle, field: str, value: object, fragment: str) -> None:
    status, body = call_json(sim.base_url + CHAT, {"model": MODEL, "messages": MSGS, field: value})
    assert status == 400
    msg = assert_openai_error(body, 400, "BadRequestError", field)
    assert msg.startswith(fragment)


def test_logprob_limits(sim: SimHandle) -> None:
    base = {"model": MODEL, "messages": MSGS}
    status, body = call_json(sim.base_url + CHAT, {**base, "top_logprobs": 3})
    assert status == 400
    assert assert_openai_error(body, 400, "BadRequestError", "top_logprobs").startswith(
        "when using `top_logprobs`, `logprobs` must be set to true."
    )
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
    msg = assert_openai_error(body, 400, "Bad Request", None)
    assert msg.startswith("1 validation error:") and "'temperature'" in msg
    status, body = call_json(sim.base_url + CHAT, {"model": MODEL})
    assert status == 400 and "'messages'" in assert_openai_error(body, 400, "Bad Request", None)
    status, body = call_json(sim.base_url + "/v1/completions", {"model": MODEL})
    assert status == 400 and "'prompt'" in assert_openai_error(body, 400, "Bad Request", None)


def test_malformed_json_is_400(sim: SimHandle) -> None:
    status, _, raw = call(sim.base_url + CHAT, raw=b'{"model": "x", "messages": [')
    assert status == 400

    assert "json_invalid" in assert_openai_error(json.loads(raw), 400, "Bad Request", None)


def test_stream_options_without_stream_is_400(sim: SimHandle) -> None:
    body = {"model": MODEL, "messages": MSGS, "stream_options": {"include_usage": True}}
    status, resp = call_json(sim.base_url + CHAT, body)
    assert status == 400
    assert "Stream options can only be defined when `stream=True`." in resp["error"]["message"]


def test_unknown_route_is_fastapi_404(sim: SimHandle) -> None:
    status, body = call_json(sim.base_url + "/v1/nothing")
    assert (status, body) == (404, {"detail": "Not Found"})
