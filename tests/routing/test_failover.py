"""An engine that dies is retried around (before the first byte), ejected, and the fallback pool used."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable

import openai
import pytest

from routing.models import RequestLog, RoutePolicy, RoutePool
from tests.routing.conftest import Proc, make_tenant_key
from tests.routing.fleet import start_member

pytestmark = pytest.mark.django_db(transaction=True)


def _metric(proxy: Proc, name: str) -> float:
    text = urllib.request.urlopen(proxy.url + "/metrics", timeout=5).read().decode()
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE))


def test_killed_engine_is_retried_around_and_ejected(
    start_proxy: Callable[..., Proc], transactional_db: None
) -> None:
    doomed = start_member("llama", "--sim-crash-after", "1")
    healthy = start_member("llama")
    try:
        tk = make_tenant_key()
        proxy = start_proxy()
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0)
        for _ in range(8):
            reply = client.chat.completions.create(
                model="llama", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            assert reply.choices[0].message.content is not None
        assert not doomed.sim.alive()
        deadline = time.monotonic() + 5
        while RequestLog.objects.count() < 8 and time.monotonic() < deadline:
            time.sleep(0.1)
        rows = list(RequestLog.objects.all())
        assert all(r.status == 200 for r in rows)
        assert any(r.retries > 0 for r in rows)
        assert _metric(proxy, "inferchain_proxy_ejections_total") >= 1
        # Once ejected, the dead engine is not tried again for every request.
        assert sum(r.retries for r in rows) <= 3
    finally:
        doomed.sim.stop()
        healthy.sim.stop()


def test_fallback_pool_takes_over_when_the_main_pool_is_down(
    start_proxy: Callable[..., Proc], transactional_db: None
) -> None:
    main = start_member("llama", role="fast")
    spare = start_member("llama", role="long")
    try:
        fast = RoutePool.objects.create(name="fast", alias="llama", role="fast", max_retries=0)
        long = RoutePool.objects.create(name="long", alias="llama", role="long")
        RoutePolicy.objects.create(name="p", alias="llama", default_pool=fast, fallback_pool=long)
        tk = make_tenant_key()
        proxy = start_proxy()
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0)
        main.sim.stop()
        failures = 0
        for _ in range(6):
            try:
                client.chat.completions.create(
                    model="llama", messages=[{"role": "user", "content": "hi"}], max_tokens=4
                )
            except openai.APIStatusError:
                failures += 1  # until the breaker opens, the dead main pool answers 502
        assert failures <= 3
        deadline = time.monotonic() + 5
        while RequestLog.objects.count() < 6 and time.monotonic() < deadline:
            time.sleep(0.1)
        last = RequestLog.objects.order_by("-id").first()
        assert last is not None and last.status == 200
        assert last.deployment_id == spare.deployment.pk and "fallback long" in last.route_reason
    finally:
        main.sim.stop()
        spare.sim.stop()


def test_engine_dying_mid_stream_ends_with_an_sse_error(
    start_proxy: Callable[..., Proc], transactional_db: None
) -> None:
    member = start_member("llama", "--sim-mean-output-tokens", "2000", time_scale=1.0)
    try:
        tk = make_tenant_key()
        proxy = start_proxy()
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0)
        stream = client.chat.completions.create(
            model="llama",
            messages=[{"role": "user", "content": "tell a long story"}],
            max_tokens=1500,
            stream=True,
        )
        got = 0
        with pytest.raises(openai.APIError) as err:
            for _chunk in stream:
                got += 1
                if got == 2:
                    member.sim.proc.kill()
        assert got >= 2
        assert "stopped in the middle" in str(err.value)
        deadline = time.monotonic() + 5
        while not RequestLog.objects.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        row = RequestLog.objects.get()
        assert row.status == 502 and row.error_type == "upstream_disconnected" and row.stream
    finally:
        member.sim.stop()
