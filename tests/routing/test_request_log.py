"""Every request leaves exactly one request-log row, written in batches; prompts only when opted in."""

from __future__ import annotations

import time
from collections.abc import Callable

import openai
import pytest

from routing.models import RequestLog
from tests.routing.conftest import Proc, make_tenant_key, post

pytestmark = pytest.mark.django_db(transaction=True)


def _wait_rows(n: int, timeout: float = 5.0) -> list[RequestLog]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = list(RequestLog.objects.order_by("id"))
        if len(rows) >= n:
            return rows
        time.sleep(0.1)
    return list(RequestLog.objects.order_by("id"))


def test_one_row_per_request_with_outcome(start_proxy: Callable[..., Proc], trivial_backend: Proc) -> None:
    tk = make_tenant_key()
    proxy = start_proxy(static=f"trivial={trivial_backend.url}")
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0)
    for _ in range(5):
        client.chat.completions.create(model="trivial", messages=[{"role": "user", "content": "secret"}])
    list(client.completions.create(model="trivial", prompt="secret", stream=True))
    post(proxy.url + "/v1/chat/completions", tk.raw_key, {"model": "nope", "messages": []})
    rows = _wait_rows(7)
    assert len(rows) == 7
    ok = [r for r in rows if r.status == 200]
    assert len(ok) == 6
    assert all(r.tenant_id == tk.tenant.pk and r.key_prefix == tk.api_key.prefix for r in rows)
    assert all(r.completion_tokens and r.latency_ms for r in ok)
    # Time to first token exists for the stream only; a whole JSON answer has none.
    assert [r.ttft_ms is not None for r in ok] == [r.stream for r in ok]
    assert all(r.route_reason and r.route_pool == "trivial" for r in ok)
    assert [r.stream for r in ok].count(True) == 1
    assert rows[-1].status == 400
    assert all(r.prompt_text is None and r.response_text is None for r in rows)
    tk.api_key.refresh_from_db()
    assert tk.api_key.last_used_at is not None


def test_prompts_kept_only_when_tenant_opts_in(
    start_proxy: Callable[..., Proc], trivial_backend: Proc
) -> None:
    tk = make_tenant_key()
    tk.tenant.log_prompts = True
    tk.tenant.save()
    proxy = start_proxy(static=f"trivial={trivial_backend.url}")
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0)
    client.chat.completions.create(model="trivial", messages=[{"role": "user", "content": "remember me"}])
    rows = _wait_rows(1)
    assert rows[0].prompt_text == "remember me"
    assert rows[0].response_text and "hello" in rows[0].response_text
