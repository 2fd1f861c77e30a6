"""Bodies vLLM's server refuses or accepts for their form, not their fields: the media type, custom
roles, null contents. The simulator answers as vLLM does (validate_json_request; chat_utils' message
types: OpenAI's plus a custom one with any role and an optional, non-null content)."""

from __future__ import annotations

import json

from tests.sim.conftest import MODEL
from tests.sim.http import call, call_json
from vllm_sim import text
from vllm_sim.testing import SimHandle

CHAT = "/v1/chat/completions"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
MEDIA_TYPE_ERROR = {
    "error": {
        "message": "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
        "type": "Bad Request",
        "param": None,
        "code": 400,
    }
}


def test_a_text_plain_body_is_refused_as_vllm_does(sim: SimHandle) -> None:
    raw = json.dumps(BODY).encode()
    for path in (CHAT, "/v1/completions", "/tokenize"):
        status, _, data = call(sim.base_url + path, raw=raw, headers={"Content-Type": "text/plain"})
        assert status == 400
        assert json.loads(data) == MEDIA_TYPE_ERROR
    # application/*+json is decoded by FastAPI but still refused by vLLM's check.
    status, _, data = call(sim.base_url + CHAT, raw=raw, headers={"Content-Type": "application/vnd.x+json"})
    assert (status, json.loads(data)) == (400, MEDIA_TYPE_ERROR)


def test_json_with_parameters_and_any_case_is_accepted(sim: SimHandle) -> None:
    raw = json.dumps(BODY).encode()
    for content_type in ("application/json; charset=utf-8", "Application/JSON"):
        status, _, data = call(sim.base_url + CHAT, raw=raw, headers={"Content-Type": content_type})
        assert status == 200, data


def test_without_a_content_type_json_is_decoded_first_then_refused(sim: SimHandle) -> None:
    # FastAPI decodes a body without Content-Type as JSON (so bad JSON is a decode error), and the
    # media-type check refuses the rest.
    status, body = call_json(sim.base_url + CHAT, raw=b"{not json", headers={"Content-Type": ""})
    assert status == 400 and "json_invalid" in body["error"]["message"]
    status, body = call_json(sim.base_url + CHAT, raw=json.dumps(BODY).encode(), headers={"Content-Type": ""})
    assert (status, body) == (400, MEDIA_TYPE_ERROR)


def test_a_custom_role_is_rendered_like_any_other(sim: SimHandle) -> None:
    messages = [{"role": "wizard", "content": "cast a spell"}, {"role": "user", "content": "hello"}]
    status, body = call_json(sim.base_url + CHAT, {**BODY, "messages": messages})
    assert status == 200, body
    rendered = text.render_chat(messages)
    assert "<|start_header_id|>wizard<|end_header_id|>" in rendered
    assert body["usage"]["prompt_tokens"] == len(text.tokenize(rendered))


def test_null_content_is_refused_except_for_assistant_messages(sim: SimHandle) -> None:
    for role in ("user", "system", "wizard"):
        status, body = call_json(sim.base_url + CHAT, {**BODY, "messages": [{"role": role, "content": None}]})
        assert status == 400, (role, body)
        err = body["error"]
        assert (err["type"], err["param"], err["code"]) == ("Bad Request", "body.messages.0.content", 400)
        assert "Input should be a valid string" in err["message"]
    # An assistant turn without text (a tool call, say) may say null; any role may leave content out.
    messages: list[dict[str, str | None]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None},
        {"role": "user"},
    ]
    status, body = call_json(sim.base_url + CHAT, {**BODY, "messages": messages})
    assert status == 200, body
    normalized = [{"role": str(m["role"]), "content": m.get("content") or ""} for m in messages]
    assert body["usage"]["prompt_tokens"] == len(text.tokenize(text.render_chat(normalized)))
