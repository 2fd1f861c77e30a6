"""A schema stage in a tenant's chain, through the official openai client and the real proxy: an answer
that matches the client's response_format passes (streamed or whole), one that does not is refused
with an OpenAI-shaped error naming the path and the problem (on a stream: an error event before
[DONE], after the text already sent, or nothing but the error with "hold"), the outcome in the request
log. The engine is the trivial backend with --echo: it answers with the last message's content, so the
test chooses the answer."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from core.redis_client import publish_config_change
from routing.models import RequestLog, StageChain
from tests.routing.conftest import REPO, Proc, free_port, make_tenant_key, wait_http
from tests.routing.test_stage_chain_guard import eventually

pytestmark = pytest.mark.django_db(transaction=True)

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
VALID = '{"name": "Ada", "age": 36}'
WRONG_TYPE = '{"name": "Ada", "age": "thirty-six"}'


@pytest.fixture
def echo_backend() -> Iterator[Proc]:
    port = free_port()
    log_path = Path(tempfile.mkstemp(prefix="echo-", suffix=".log")[1])
    with log_path.open("wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "benchmarks" / "trivial_backend.py"), "--port", str(port), "--echo"],
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    handle = Proc(proc, port, log_path)
    try:
        wait_http(f"{handle.url}/health", proc, log_path, 10)
        yield handle
    finally:
        handle.stop()


def ask(client: openai.OpenAI, answer: str, **extra: Any) -> Any:
    return client.chat.completions.create(
        model="echo", messages=[{"role": "user", "content": answer}], max_tokens=50, **extra
    )


def streamed(client: openai.OpenAI, answer: str, received: list[str], **extra: Any) -> None:
    for chunk in ask(client, answer, stream=True, **extra):
        if chunk.choices:
            received.append(chunk.choices[0].delta.content or "")


def checked_client(
    start_proxy: Callable[..., Proc], echo_backend: Proc, config: dict[str, Any] | None = None
) -> openai.OpenAI:
    acme = make_tenant_key("acme")
    StageChain.objects.create(
        name="checked",
        alias="echo",
        tenant=acme.tenant,
        stages=[{"kind": "generate"}, {"kind": "schema", "name": "check", "config": config or {}}],
    )
    publish_config_change("stage_chain")
    proxy = start_proxy(static=f"echo={echo_backend.url}")
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=acme.raw_key, max_retries=0, timeout=30)

    def checking() -> bool:
        try:
            ask(client, "not json", response_format={"type": "json_object"})
        except openai.APIStatusError:
            return True
        return False

    eventually(checking)
    return client


def test_whole_answers_are_checked_against_the_response_format(
    start_proxy: Callable[..., Proc], echo_backend: Proc
) -> None:
    client = checked_client(start_proxy, echo_backend)
    assert ask(client, VALID, response_format=JSON_SCHEMA).choices[0].message.content == VALID
    assert ask(client, "[1, 2]").choices[0].message.content == "[1, 2]"  # no response_format: no check

    with pytest.raises(openai.InternalServerError) as err:
        ask(client, WRONG_TYPE, response_format=JSON_SCHEMA)
    assert err.value.status_code == 502 and err.value.code == "response_format_mismatch"
    assert "at $.age: 'thirty-six' is not of type 'integer'" in err.value.message
    with pytest.raises(openai.InternalServerError) as err:
        ask(client, '{"name": "Ada"}', response_format=JSON_SCHEMA)
    assert "at $: 'age' is a required property" in err.value.message
    with pytest.raises(openai.InternalServerError) as err:
        ask(client, "[1, 2]", response_format={"type": "json_object"})
    assert "not an object" in err.value.message
    with pytest.raises(openai.InternalServerError) as err:
        ask(client, '{"name": "Ada", ', response_format={"type": "json_object"})
    assert "not valid JSON" in err.value.message

    eventually(
        lambda: RequestLog.objects.filter(route_reason__contains="(check invalid)", status=502).exists()
    )


def test_a_stream_that_fails_the_check_ends_with_an_error_event(
    start_proxy: Callable[..., Proc], echo_backend: Proc
) -> None:
    client = checked_client(start_proxy, echo_backend)
    received: list[str] = []
    streamed(client, VALID, received, response_format=JSON_SCHEMA)
    assert "".join(received) == VALID and sum(1 for p in received if p) >= 2  # still a stream

    received = []
    with pytest.raises(openai.APIError) as err:
        streamed(client, WRONG_TYPE, received, response_format=JSON_SCHEMA)
    assert err.value.code == "response_format_mismatch"
    assert "at $.age: 'thirty-six' is not of type 'integer'" in err.value.message
    # What had streamed before the end stays sent (the backend writes its events at once, so here the
    # error replaces the whole last batch); the failing end never reaches the client.
    got = "".join(received)
    assert WRONG_TYPE.startswith(got) and got != WRONG_TYPE
    eventually(
        lambda: RequestLog.objects.filter(route_reason__contains="(check invalid)", stream=True).exists()
    )


def test_hold_sends_nothing_of_an_answer_that_fails(
    start_proxy: Callable[..., Proc], echo_backend: Proc
) -> None:
    client = checked_client(start_proxy, echo_backend, {"hold": True})
    received: list[str] = []
    streamed(client, VALID, received, response_format=JSON_SCHEMA)
    assert "".join(received) == VALID
    assert [p for p in received if p] == [VALID]  # held, then sent whole with the last chunk

    received = []
    with pytest.raises(openai.APIError) as err:
        streamed(client, WRONG_TYPE, received, response_format=JSON_SCHEMA)
    assert err.value.code == "response_format_mismatch"
    assert "".join(received) == ""
