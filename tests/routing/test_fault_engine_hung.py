"""An engine that hangs under streaming load (frozen with SIGSTOP: its socket still accepts connections,
streams in flight stall mid-way, new requests get nothing at all): stalled streams end at the inter-token
timeout with an SSE error and a logged 504, new requests time out at first byte and are retried on the
healthy engine, the hung one is ejected, and clients do not pile up on it (measured)."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pytest

from routing.models import RequestLog, RoutePool
from tests.routing.conftest import Proc, make_tenant_key
from tests.routing.fleet import start_member
from tests.routing.load import Client, Load, summary

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
TIMEOUT_S = 0.5
CLIENTS = 16
STREAM = {
    "model": "llama",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 200,
    "ignore_eos": True,
    "stream": True,
}


def _inflight(proxy: Proc) -> dict[str, float]:
    text = urllib.request.urlopen(proxy.url + "/metrics", timeout=5).read().decode()
    found = re.findall(r'^inferchain_proxy_inflight\{deployment="([^"]*)"\} (\S+)$', text, re.MULTILINE)
    return {label: float(value) for label, value in found}


def test_hung_engine_under_load(start_proxy: Callable[..., Proc]) -> None:
    hung = start_member("llama", time_scale=2.0)
    healthy = start_member("llama", time_scale=2.0)
    try:
        RoutePool.objects.create(
            name="llama",
            alias="llama",
            first_byte_timeout_s=TIMEOUT_S,
            inter_token_timeout_s=TIMEOUT_S,
            max_retries=1,
        )
        tk = make_tenant_key()
        proxy = start_proxy()
        label = str(hung.deployment.pk)
        peak_on_hung = 0.0
        stop = threading.Event()

        def watch() -> None:
            nonlocal peak_on_hung
            while not stop.is_set():
                peak_on_hung = max(peak_on_hung, _inflight(proxy).get(label, 0.0))
                time.sleep(0.05)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        # Lengths vary so the clients fall out of step: when the engine hangs, most of its streams are
        # mid-way rather than all starting together.
        client = Client(
            "s",
            proxy.url + "/v1/chat/completions",
            tk.raw_key,
            STREAM,
            CLIENTS,
            make=lambda rng: ({**STREAM, "max_tokens": rng.randint(50, 300)}, {}),
        )
        with Load([client]) as load:
            time.sleep(1.5)
            os.kill(hung.sim.proc.pid, signal.SIGSTOP)
            time.sleep(5.0)
        stop.set()
        watcher.join(5)
        samples = load.samples
        left_on_hung = _inflight(proxy).get(label, 0.0)

        deadline = time.monotonic() + 10
        while RequestLog.objects.count() < len(samples) and time.monotonic() < deadline:
            time.sleep(0.2)
        rows = list(
            RequestLog.objects.order_by("id").values(
                "status", "error_type", "deployment_id", "retries", "stream"
            )
        )
        stalled = [s for s in samples if s.stream_error]
        waits = sorted(s.ended - s.started for s in samples)
        print(
            f"\nengine hung under {CLIENTS} streaming clients: clients saw {summary(samples)}; "
            f"{len(stalled)} streams stalled mid-way ended at the inter-token timeout; "
            f"rows {summary_rows(rows)}, {sum(1 for r in rows if r['retries'])} retried on the healthy "
            f"engine after a first-byte timeout; longest client wait {waits[-1]:.2f} s, p99 "
            f"{waits[int(len(waits) * 0.99)]:.2f} s; at most {peak_on_hung:.0f} requests waiting on the hung "
            f"engine at once, {left_on_hung:.0f} left at the end"
        )

        assert stalled, "no stream was in flight when the engine hung"
        assert all(s.code == "upstream_timeout" for s in stalled), summary(stalled)
        assert all(s.status == 200 for s in samples), summary(samples)  # nothing failed before first byte
        timed_out = [r for r in rows if r["status"] == 504]
        assert len(timed_out) == len(stalled)
        assert all(
            r["error_type"] == "upstream_timeout" and r["deployment_id"] == hung.deployment.pk
            for r in timed_out
        )
        assert len(rows) == len(samples)
        # No pile-up: the hung engine holds at most the clients that were on it when it hung (plus a
        # half-open probe), every client waits about one timeout at most, and nothing is left waiting.
        assert peak_on_hung <= CLIENTS
        assert waits[-1] < 3 * TIMEOUT_S + 2.0
        assert left_on_hung == 0
        # After the ejection almost everything goes to the healthy engine.
        late = [r for r in rows[-len(rows) // 2 :] if r["deployment_id"] == hung.deployment.pk]
        assert len(late) <= 5, late
    finally:
        os.kill(hung.sim.proc.pid, signal.SIGCONT)
        hung.sim.stop()
        healthy.sim.stop()


def summary_rows(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rows:
        key = f"{r['status']} {r['error_type'] or ''}".strip()
        counts[key] = counts.get(key, 0) + 1
    return counts
