"""An engine killed (SIGKILL) under mixed load: no request that had not started streaming fails (they
are retried on the other engine), streams in flight on it end with a clean SSE error and a logged 502,
the endpoint is ejected within 2 s, and it takes traffic again once it is restarted on its port (as its
agent does: same deployment, port and engine key)."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from nodes.lifecycle import engine_api_key
from routing.models import RequestLog
from tests.routing.conftest import Proc, make_tenant_key
from tests.routing.fleet import SIM_MODEL, start_member
from tests.routing.load import Client, Load, summary
from vllm_sim.testing import start_sim

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
TIME_SCALE = 10.0  # streams of 64 tokens last ~0.2 s: several are in flight at any moment
CHAT = {
    "model": "llama",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 64,
    "ignore_eos": True,
}


def _metric(proxy: Proc, name: str) -> float:
    text = urllib.request.urlopen(proxy.url + "/metrics", timeout=5).read().decode()
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE))


def test_engine_killed_under_load(start_proxy: Callable[..., Proc]) -> None:
    doomed = start_member("llama", time_scale=TIME_SCALE)
    healthy = start_member("llama", time_scale=TIME_SCALE)
    restarted = None
    try:
        tk = make_tenant_key()
        proxy = start_proxy()
        url = proxy.url + "/v1/chat/completions"
        clients = [
            Client("json", url, tk.raw_key, CHAT, concurrency=4),
            Client("stream", url, tk.raw_key, {**CHAT, "stream": True}, concurrency=4),
        ]
        with Load(clients, timeout=20) as load:
            time.sleep(2.0)
            doomed.sim.proc.kill()
            killed_at = time.monotonic()
            while _metric(proxy, "inferchain_proxy_ejections_total") < 1:
                assert time.monotonic() - killed_at < 10, "the dead engine was never ejected"
                time.sleep(0.02)
            ejected_s = time.monotonic() - killed_at
            time.sleep(1.0)
            # Its agent restarts it: the same deployment on the same port with the same engine key.
            dep = doomed.deployment
            restarted = start_sim(
                SIM_MODEL,
                "--served-model-name",
                "llama",
                "--max-model-len",
                str(dep.max_model_len),
                port=dep.port,
                api_key=engine_api_key(dep),
                time_scale=TIME_SCALE,
            )
            restarted_at = time.monotonic()
            # The breaker's half-open probe comes after its cooldown (2 s, doubled per failed probe).
            served = RequestLog.objects.filter(deployment_id=dep.pk, status=200)
            seen = served.count()
            while served.count() == seen and time.monotonic() - restarted_at < 10:
                time.sleep(0.2)
            time.sleep(0.5)
        samples = load.samples

        deadline = time.monotonic() + 10
        while RequestLog.objects.count() < len(samples) and time.monotonic() < deadline:
            time.sleep(0.2)
        rows = list(
            RequestLog.objects.order_by("id").values(
                "status", "error_type", "stream", "deployment_id", "created_at"
            )
        )
        logged_502 = [r for r in rows if r["status"] == 502]
        sse_errors = [s for s in samples if s.stream_error]
        failed_json = [s for s in samples if s.label == "json" and s.status != 200]
        stream_failed_before_first_byte = [s for s in samples if s.label == "stream" and s.status != 200]
        doomed_rows = [r for r in rows if r["deployment_id"] == doomed.deployment.pk]
        # Rows carry wall-clock times: the first answer from the restarted engine, against its restart.
        restarted_wall = datetime.fromtimestamp(time.time() - (time.monotonic() - restarted_at), tz=UTC)
        back = (
            RequestLog.objects.filter(
                deployment_id=doomed.deployment.pk, status=200, created_at__gt=restarted_wall
            )
            .order_by("created_at")
            .first()
        )
        back_s = None if back is None else (back.created_at - restarted_wall).total_seconds()
        print(
            f"\nengine killed under load: clients saw {summary(samples)}; "
            f"ejected {ejected_s:.2f} s after the kill; "
            f"{len(sse_errors)} streams cut mid-way (SSE error), {len(logged_502)} rows logged 502; "
            f"{len(doomed_rows)} rows on the killed engine in all; served by it again "
            f"{'never' if back_s is None else f'{back_s:.2f} s'} after its restart"
        )

        assert not failed_json, summary(failed_json)
        assert not stream_failed_before_first_byte, summary(stream_failed_before_first_byte)
        assert len(sse_errors) <= 4  # only streams in flight on the killed engine at the kill
        assert all(s.code == "upstream_disconnected" or "upstream" in s.code for s in sse_errors), summary(
            sse_errors
        )
        assert len(logged_502) == len(sse_errors)
        assert all(r["error_type"] == "upstream_disconnected" and r["stream"] for r in logged_502)
        assert ejected_s < 2.0
        assert len(rows) == len(samples)
        assert back_s is not None and 0 < back_s < 8.0
    finally:
        doomed.sim.stop()
        healthy.sim.stop()
        if restarted is not None:
            restarted.stop()
