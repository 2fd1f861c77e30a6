"""Soak: steady mixed load against a demo-like fleet through the proxy, with real keys and quotas.

The demo's shape: three simulated engines behind the demo's routing (two high-throughput engines in the
fast pool, one long-context engine for long prompts and `x-task: summarize`), two proxy processes, and
two tenants (one with the demo tenant's quota, one unlimited) sending the demo traffic generator's mix
of short chats, summaries and long documents, half of them streamed.

Checked at the end: zero unexpected errors (every request answered 200, no stream cut), one request-log
row per request sent, and each process's memory flat after warm-up (its growth from the end of the
warm-up to the end is printed per process and bounded).

`make test` runs SOAK_SECONDS=60 (the default here); `make soak` runs 1800.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from inferchain.demo_traffic import demo_request
from routing.demo import DEMO_ALIAS, DEMO_TENANT_QUOTA, seed_demo_routing
from routing.models import RequestLog
from tests.routing.conftest import Proc, make_tenant_key
from tests.routing.fleet import start_member
from tests.routing.load import Client, Load, summary

SOAK_SECONDS = float(os.environ.get("SOAK_SECONDS", "60"))
WARMUP_FRACTION = 1 / 3
SAMPLE_EVERY_S = 5.0
# Flat: growth after warm-up within this share of the warm size plus a fixed allowance (allocator
# arenas and caches settle in steps, which on a short run can look like growth).
GROWTH_SHARE = 0.10
GROWTH_ALLOWANCE_MIB = 12.0

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("redis_clean"),
    pytest.mark.timeout(int(SOAK_SECONDS) + 300),
]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def mixed(rng: random.Random) -> tuple[dict[str, Any], dict[str, str]]:
    body, headers = demo_request(rng, DEMO_ALIAS)
    if rng.random() < 0.5:
        body["stream"] = True
    return body, headers


def test_soak(start_proxy: Callable[..., Proc]) -> None:
    fleet = [
        start_member(DEMO_ALIAS, role="long-context", max_model_len=65536, time_scale=50.0),
        start_member(DEMO_ALIAS, role="high-throughput", max_model_len=8192, time_scale=50.0),
        start_member(DEMO_ALIAS, role="high-throughput", max_model_len=8192, time_scale=50.0),
    ]
    try:
        seed_demo_routing()
        quota: dict[str, Any] = dict(DEMO_TENANT_QUOTA)
        quota_key = make_tenant_key("soak-quota", **quota)
        open_key = make_tenant_key("soak-open")
        proxies = [start_proxy() for _ in range(2)]
        clients = [
            Client(label, p.url + "/v1/chat/completions", tk.raw_key, {}, concurrency=2, make=mixed)
            for p in proxies
            for label, tk in (("quota", quota_key), ("open", open_key))
        ]
        processes = {f"proxy-{i}": p.proc.pid for i, p in enumerate(proxies)} | {
            f"engine-{m.deployment.name}": m.sim.proc.pid for m in fleet
        }
        memory: dict[str, list[tuple[float, float]]] = {name: [] for name in processes}
        stop = threading.Event()

        def sample_memory() -> None:
            while True:
                now = time.monotonic()
                for name, pid in processes.items():
                    memory[name].append((now, rss_mib(pid)))
                if stop.wait(SAMPLE_EVERY_S):
                    return

        started = time.monotonic()
        sampler = threading.Thread(target=sample_memory, daemon=True)
        sampler.start()
        with Load(clients, timeout=60, pause=0.05) as load:
            time.sleep(SOAK_SECONDS)
        stop.set()
        sampler.join(10)
        samples = load.samples

        deadline = time.monotonic() + 30
        while RequestLog.objects.count() < len(samples) and time.monotonic() < deadline:
            time.sleep(0.5)
        rows = RequestLog.objects.count()

        warm_at = started + SOAK_SECONDS * WARMUP_FRACTION
        report = []
        grown = []
        for name, series in memory.items():
            warm = [mib for t, mib in series if t >= warm_at]
            growth = warm[-1] - warm[0]
            report.append(
                f"{name} {series[0][1]:.0f}->{warm[0]:.0f}->{warm[-1]:.0f} MiB "
                f"(max {max(mib for _, mib in series):.0f}, {growth:+.1f} after warm-up)"
            )
            if growth > warm[0] * GROWTH_SHARE + GROWTH_ALLOWANCE_MIB:
                grown.append(name)
        roles: dict[int | None, str] = {m.deployment.pk: m.deployment.role for m in fleet}
        routes: dict[str, int] = {}
        for dep_id in RequestLog.objects.values_list("deployment_id", flat=True):
            routes[roles.get(dep_id, "none")] = routes.get(roles.get(dep_id, "none"), 0) + 1
        print(
            f"\nsoak {SOAK_SECONDS:.0f} s: {len(samples)} requests ({len(samples) / SOAK_SECONDS:.1f}/s), "
            f"clients saw {summary(samples)}; request-log rows {rows}; by engine role {routes}; memory RSS "
            f"start->end of warm-up ({SOAK_SECONDS * WARMUP_FRACTION:.0f} s)->end: " + "; ".join(report)
        )

        assert all(s.status == 200 and not s.stream_error for s in samples), summary(samples)
        assert rows == len(samples)
        assert not grown, report
        assert all(p.proc.poll() is None for p in proxies) and all(m.sim.alive() for m in fleet)
    finally:
        for member in fleet:
            member.sim.stop()
