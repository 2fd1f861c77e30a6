"""Per-pool timeouts: first byte (retried on another endpoint), total (whole answers and streams)."""

from __future__ import annotations

import time
from collections.abc import Callable

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from routing.models import RequestLog, RoutePool
from tests.routing.conftest import Proc, make_tenant_key
from tests.routing.fleet import start_member

pytestmark = pytest.mark.django_db(transaction=True)

HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


def _rows(count: int) -> list[RequestLog]:
    deadline = time.monotonic() + 5
    while RequestLog.objects.count() < count and time.monotonic() < deadline:
        time.sleep(0.1)
    return list(RequestLog.objects.order_by("id"))


def test_hung_engine_times_out_at_first_byte_and_is_retried_elsewhere(
    start_proxy: Callable[..., Proc], transactional_db: None
) -> None:
    hung = start_member("llama", "--sim-hang-after", "0")  # accepts requests, never generates
    healthy = start_member("llama")
    try:
        RoutePool.objects.create(
            name="llama", alias="llama", scorer="round_robin", first_byte_timeout_s=0.5, max_retries=1
        )
        tk = make_tenant_key()
        proxy = start_proxy()
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0)
        for _ in range(2):  # round robin: at least one of the two starts on the hung engine
            stream = client.chat.completions.create(model="llama", messages=HI, max_tokens=4, stream=True)
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        rows = _rows(2)
        assert [r.status for r in rows] == [200, 200]
        # Every answer came from the healthy engine. Round robin counts retries too, so one or both
        # requests start on the hung engine; each that did waited out the first-byte timeout once.
        assert all(r.deployment_id == healthy.deployment.pk for r in rows)
        retried = [r for r in rows if r.retries]
        assert retried and all(r.retries == 1 for r in retried)
        assert all(r.latency_ms is not None and 450 <= r.latency_ms < 5000 for r in retried)
    finally:
        hung.sim.stop()
        healthy.sim.stop()


def test_first_byte_timeout_without_a_spare_is_a_504(
    start_proxy: Callable[..., Proc], transactional_db: None
) -> None:
    hung = start_member("llama", "--sim-hang-after", "0")
    try:
        RoutePool.objects.create(name="llama", alias="llama", first_byte_timeout_s=0.5, max_retries=0)
        tk = make_tenant_key()
        proxy = start_proxy()
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0)
        started = time.monotonic()
        with pytest.raises(openai.APIStatusError) as err:
            list(client.chat.completions.create(model="llama", messages=HI, max_tokens=4, stream=True))
        elapsed = time.monotonic() - started
        assert err.value.status_code == 504
        assert err.value.code == "upstream_timeout"
        assert 0.45 <= elapsed < 5
    finally:
        hung.sim.stop()


def test_whole_answer_is_bounded_by_the_total_timeout(
    start_proxy: Callable[..., Proc], transactional_db: None
) -> None:
    hung = start_member("llama", "--sim-hang-after", "0")
    try:
        # A non-streamed answer arrives whole, so only the total timeout bounds it.
        RoutePool.objects.create(
            name="llama", alias="llama", first_byte_timeout_s=0.2, total_timeout_s=1.0, max_retries=0
        )
        tk = make_tenant_key()
        proxy = start_proxy()
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0)
        started = time.monotonic()
        with pytest.raises(openai.APIStatusError) as err:
            client.chat.completions.create(model="llama", messages=HI, max_tokens=4)
        elapsed = time.monotonic() - started
        assert err.value.status_code == 504 and err.value.code == "upstream_timeout"
        assert 0.95 <= elapsed < 5
        (row,) = _rows(1)
        assert row.status == 504 and row.error_type == "upstream_timeout"
    finally:
        hung.sim.stop()


def test_stream_past_the_total_timeout_ends_with_an_sse_error(
    start_proxy: Callable[..., Proc], transactional_db: None
) -> None:
    slow = start_member("llama", "--sim-mean-output-tokens", "2000", time_scale=1.0)
    try:
        RoutePool.objects.create(name="llama", alias="llama", total_timeout_s=1.0, max_retries=0)
        tk = make_tenant_key()
        proxy = start_proxy()
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0)
        started = time.monotonic()
        got = 0
        stream = client.chat.completions.create(
            model="llama",
            messages=[{"role": "user", "content": "a long story"}],
            max_tokens=1500,
            stream=True,
        )
        with pytest.raises(openai.APIError) as err:
            for _chunk in stream:
                got += 1
        elapsed = time.monotonic() - started
        assert got >= 2  # tokens flowed before the deadline
        assert "stopped in the middle" in str(err.value)
        assert 0.95 <= elapsed < 5
        (row,) = _rows(1)
        assert row.status == 504 and row.error_type == "upstream_timeout" and row.stream
    finally:
        slow.sim.stop()
