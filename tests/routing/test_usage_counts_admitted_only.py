"""A tenant's usage and spend count admitted work only: requests refused at the door (rate limit, scope,
context checks) carry prompt tokens the proxy counted, and those are shown apart, never in the usage.
Through the real proxy, then the console's usage APIs (routing/cost.py)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from routing import cost
from routing.models import RequestLog
from tests.routing.conftest import Proc, make_tenant_key, post

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = "word " * 2000  # about 2,500 tokens by the proxy's estimate: a refusal's prompt is not small


def _rows(tenant_id: int, expected: int) -> list[RequestLog]:
    deadline = time.monotonic() + 10
    while RequestLog.objects.filter(tenant_id=tenant_id).count() < expected and time.monotonic() < deadline:
        time.sleep(0.1)
    return list(RequestLog.objects.filter(tenant_id=tenant_id))


def test_refused_requests_are_counted_apart_from_usage(
    start_proxy: Callable[..., Proc], trivial_backend: Proc, redis_clean: None, admin_client: APIClient
) -> None:
    tk = make_tenant_key("metered", scopes=["trivial"], requests_per_minute=2)
    proxy = start_proxy(static=f"trivial={trivial_backend.url},other={trivial_backend.url}")
    chat = {"model": "trivial", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8}
    statuses = [post(proxy.url + "/v1/chat/completions", tk.raw_key, chat).status for _ in range(5)]
    assert statuses == [200, 200, 429, 429, 429]
    assert post(proxy.url + "/v1/chat/completions", tk.raw_key, {**chat, "model": "other"}).status == 403

    rows = _rows(tk.tenant.pk, 6)
    admitted = [r for r in rows if r.status == 200]
    refused = [r for r in rows if r.status >= 400]
    assert len(admitted) == 2 and len(refused) == 4
    refused_prompt = sum(r.prompt_tokens or 0 for r in refused)
    assert refused_prompt > 5000  # the three 429s' prompts were counted at the door
    admitted_prompt = sum(r.prompt_tokens or 0 for r in admitted)
    admitted_output = sum(r.completion_tokens or 0 for r in admitted)

    body = admin_client.get("/api/routing/cost/tenants/", {"hours": 1, "tenant_id": tk.tenant.pk}).json()
    (usage,) = body["results"]
    assert (usage["requests"], usage["prompt_tokens"], usage["output_tokens"]) == (
        2,
        admitted_prompt,
        admitted_output,
    )
    assert (usage["refused_requests"], usage["refused_prompt_tokens"], usage["failed_requests"]) == (
        4,
        refused_prompt,
        0,
    )

    hourly = admin_client.get("/api/routing/usage/", {"hours": 1, "tenant_id": tk.tenant.pk}).json()
    assert sum(b["requests"] for b in hourly) == 6  # every request is still in the request count
    assert sum(b["refused"] for b in hourly) == 4
    assert sum(b["prompt_tokens"] for b in hourly) == admitted_prompt
    assert sum(b["completion_tokens"] for b in hourly) == admitted_output


def test_an_answer_that_failed_midway_is_admitted_and_one_with_none_is_not(admin_client: APIClient) -> None:
    tk = make_tenant_key("broken")
    now = timezone.now()

    def row(status: int, prompt: int, completion: int | None) -> RequestLog:
        return RequestLog(
            created_at=now - dt.timedelta(minutes=1),
            tenant_id=tk.tenant.pk,
            tenant_name="broken",
            alias="m",
            status=status,
            prompt_tokens=prompt,
            completion_tokens=completion,
        )

    RequestLog.objects.bulk_create(
        [row(200, 10, 5), row(502, 20, 7), row(502, 40, None), row(400, 80, None), row(429, 160, None)]
    )
    window = cost.Window(start=now - dt.timedelta(hours=1), end=now)
    (usage,) = cost.tenant_usage(window, [tk.tenant.pk])
    assert (usage.requests, usage.prompt_tokens, usage.output_tokens) == (2, 30, 12)
    assert (usage.refused_requests, usage.refused_prompt_tokens, usage.failed_requests) == (2, 240, 1)
