"""`/v1/` requests the engines would not take: the proxy answers them itself, in the OpenAI error shape
and as vLLM would (media type, custom roles, null contents), or passes them on when vLLM takes them."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from routing.models import RequestLog
from tests.routing.conftest import Proc, make_tenant_key, post
from tests.routing.fleet import FleetMember, start_member
from vllm_sim import text

pytestmark = pytest.mark.django_db(transaction=True)

CHAT_BODY = {"model": "llama", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


@pytest.fixture
def member(transactional_db: None, redis_clean: None) -> Iterator[FleetMember]:
    found = start_member("llama")
    yield found
    found.sim.stop()


def _rows(count: int) -> list[RequestLog]:
    deadline = time.monotonic() + 5
    while RequestLog.objects.count() < count and time.monotonic() < deadline:
        time.sleep(0.1)
    return list(RequestLog.objects.order_by("id"))


def _raw_post(proxy: Proc, path: str, key: str, body: bytes, content_type: str | None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    headers = {"Authorization": f"Bearer {key}"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    conn.request("POST", path, body=body, headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, json.loads(data)


def _openai_error(reply: Any, status: int, code: str) -> dict[str, Any]:
    assert reply.status == status, reply.text
    error: dict[str, Any] = reply.json()["error"]
    assert list(error) == ["message", "type", "param", "code"]
    assert (error["type"], error["code"]) == ("invalid_request_error", code)
    return error


def test_unserved_v1_paths_get_an_openai_error_naming_what_is_served(
    start_proxy: Callable[..., Proc], member: FleetMember
) -> None:
    tk = make_tenant_key()
    proxy = start_proxy()
    for path in ("/v1/responses", "/v1/audio/transcriptions", "/v1/chat/completion", "/v1"):
        error = _openai_error(post(proxy.url + path, tk.raw_key, CHAT_BODY), 404, "unsupported_endpoint")
        assert error["message"].startswith(f"POST {path} is not served here.")
        assert "POST /v1/chat/completions, POST /v1/completions" in error["message"]
    with pytest.raises(openai.NotFoundError) as err:
        openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0).batches.list()
    assert "GET /v1/batches is not served here" in str(err.value)


def test_embeddings_on_a_simulated_model_are_refused_before_any_engine(
    start_proxy: Callable[..., Proc], member: FleetMember
) -> None:
    tk = make_tenant_key()
    proxy = start_proxy()
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0)
    with pytest.raises(openai.NotFoundError) as err:
        client.embeddings.create(model="llama", input="hello")
    body: Any = err.value.body
    assert body["code"] == "unsupported_endpoint"
    assert body["message"].startswith("The model 'llama' does not serve /v1/embeddings")
    [row] = _rows(1)
    assert (row.status, row.error_type, row.deployment_id) == (404, "unsupported_endpoint", None)


def test_an_engine_without_the_route_is_answered_in_openai_shape(
    start_proxy: Callable[..., Proc], member: FleetMember
) -> None:
    # A static endpoint's engine is unknown to the proxy, so the request goes out; the simulator (like
    # vLLM serving a generative model) has no /v1/embeddings and says FastAPI's {"detail": "Not Found"}.
    sim = member.sim
    tk = make_tenant_key()
    proxy = start_proxy(static=f"plain={sim.base_url}|{sim.api_key}")
    reply = post(proxy.url + "/v1/embeddings", tk.raw_key, {"model": "plain", "input": "hello"})
    error = _openai_error(reply, 404, "unsupported_endpoint")
    assert error["message"].startswith("The model 'plain' does not serve /v1/embeddings")


def test_a_body_not_sent_as_json_is_refused_as_vllm_does(
    start_proxy: Callable[..., Proc], member: FleetMember
) -> None:
    tk = make_tenant_key()
    proxy = start_proxy()
    raw = json.dumps(CHAT_BODY).encode()
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        status, body = _raw_post(proxy, "/v1/chat/completions", tk.raw_key, raw, content_type)
        assert status == 400, body
        assert body["error"]["code"] == "unsupported_media_type"
        assert body["error"]["message"].startswith(
            "Unsupported Media Type: Only 'application/json' is allowed"
        )
    json_utf8 = "application/json; charset=utf-8"
    status, body = _raw_post(proxy, "/v1/chat/completions", tk.raw_key, raw, json_utf8)
    assert status == 200, body
    rows = _rows(4)
    assert [r.deployment_id for r in rows] == [None, None, None, member.deployment.pk]


def test_a_custom_role_reaches_the_engine_and_is_counted_as_it_counts(
    start_proxy: Callable[..., Proc], member: FleetMember
) -> None:
    # vLLM's message types include one with any role; its chat template renders it (here Llama-3 style).
    tk = make_tenant_key(max_input_tokens=60)
    proxy = start_proxy()
    messages = [{"role": "wizard", "content": "cast a spell " * 5}, {"role": "user", "content": "hello"}]
    reply = post(proxy.url + "/v1/chat/completions", tk.raw_key, {**CHAT_BODY, "messages": messages})
    assert reply.status == 200, reply.text
    expected = len(text.tokenize(text.render_chat(messages)))
    assert reply.json()["usage"]["prompt_tokens"] == expected
    # The proxy's own count (checked against the key's input cap before the engine) is the same number.
    over = [{"role": "wizard", "content": "cast a spell " * 20}, {"role": "user", "content": "hello"}]
    refused = post(proxy.url + "/v1/chat/completions", tk.raw_key, {**CHAT_BODY, "messages": over})
    error = _openai_error(refused, 400, "input_tokens_exceeded")
    assert error["message"].startswith(f"The prompt has {len(text.tokenize(text.render_chat(over)))} tokens")


def test_null_content_is_refused_except_on_assistant_messages(
    start_proxy: Callable[..., Proc], member: FleetMember
) -> None:
    tk = make_tenant_key()
    proxy = start_proxy()
    url = proxy.url + "/v1/chat/completions"
    for role in ("user", "system", "wizard"):
        reply = post(url, tk.raw_key, {**CHAT_BODY, "messages": [{"role": role, "content": None}]})
        assert reply.status == 400, reply.text
        error = reply.json()["error"]
        assert error["param"] == "messages" and "messages[0].content is null" in error["message"]
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}, {"role": "user"}]
    reply = post(url, tk.raw_key, {**CHAT_BODY, "messages": messages})
    assert reply.status == 200, reply.text
    rows = _rows(4)
    assert [r.deployment_id for r in rows] == [None, None, None, member.deployment.pk]
