"""The control plane's fleet exposition (/metrics) at 100 hosts x 8 GPUs and 400 engines.

    .venv/bin/python benchmarks/fleet_exposition.py [--hosts 100 --gpus 8 --engines 400 --runs 50]

A scratch SQLite database (or `--database-url`, e.g. a PostgreSQL database of your own, whose rows it
adds and leaves) gets the inventory: hosts, GPUs, deployments of one model version, 200 tenants with
a daily budget. Redis (REDIS_URL, a key prefix of its own, removed at the end) gets a live record per
GPU and per engine in the shape the agent writes, and each tenant's tokens of the day. Then it times
the whole scrape, `routing.fleet_metrics.render()` (four queries, one MGET, the text), `--runs` times
after one warm-up, and prints the median, p95 and max with the body's size and sample count, and the
medians of its two halves timed apart in the same runs (`read_state`: the queries and the MGET;
`render_state`: the text) (JSON in var/bench/fleet_exposition.json). Then it times what a scrape
costs since renders are shared (routing/fleet_metrics.py's docstring): `metrics_view` as Prometheus
calls it (the metrics token, `Accept-Encoding: gzip`), `--runs` scrapes `--scrape-gap` seconds apart
after one that starts refresh-ahead, with a thread of this process standing in for the Celery worker's
beat task (`refresh_if_due` every 0.25 s), so the renders compete with the timed scrapes for this
process as they would not in a web process (`scrape_*`, and the body's gzip'd size). `--profile` adds
cProfile's top functions over as many more renders, on stderr. `--baseline FILE` (another version of
routing/fleet_metrics.py) checks both render the same bytes, then times the two render_state
alternately on one state, `--runs` pairs: the ratio in one run. The budget is 100 ms per scrape
(issue 32).
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import importlib.util
import json
import os
import pstats
import secrets
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCH_DIR = REPO / "var" / "bench"


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fakefleet import add_fleet_arguments, create_fleet, setup_django

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_fleet_arguments(parser)
    parser.add_argument("--tenants", type=int, default=200)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument(
        "--baseline",
        default="",
        help="another version of routing/fleet_metrics.py (e.g. `git show main:routing/fleet_metrics.py`"
        " saved to a file) whose render_state is timed interleaved with this one's, on the same state",
    )
    parser.add_argument(
        "--profile", action="store_true", help="also print cProfile's top functions over --runs scrapes"
    )
    parser.add_argument("--scrape-gap", type=float, default=0.5, help="seconds between timed scrapes")
    options = parser.parse_args()

    token = secrets.token_urlsafe(24)
    setup_django("fleet", options.database_url, METRICS_TOKEN=token)
    from django.db import connection
    from django.test import RequestFactory
    from django.utils import timezone

    from console.models import Quota, Tenant
    from core.redis_client import get_redis
    from nodes.lifecycle import live_deployment_key, live_gpu_key
    from routing.fleet_metrics import metrics_view, read_state, refresh_if_due, render, render_state
    from routing.proxy.limits import budget_key, tenant_scope

    fleet = create_fleet(
        "b", hosts=options.hosts, gpus=options.gpus, engines=options.engines, heartbeat=timezone.now()
    )
    tag, hosts, deployments = fleet.tag, fleet.hosts, fleet.deployments
    tenants = Tenant.objects.bulk_create(
        Tenant(name=f"b{tag}-tenant-{t:03d}") for t in range(options.tenants)
    )
    Quota.objects.bulk_create(Quota(tenant=t, daily_token_budget=10_000_000) for t in tenants)

    r = get_redis()
    ts = time.time()
    pipe = r.pipeline(transaction=False)
    for host in hosts:
        for i in range(options.gpus):
            sample = {
                "index": i, "ts": ts, "simulated": False, "utilization_pct": 87.0,
                "memory_used_bytes": 72 * 2**30, "memory_total_bytes": 80 * 2**30,
                "temperature_c": 66.0, "power_watts": 512.5,
            }  # fmt: skip
            pipe.set(live_gpu_key(host.name, i), json.dumps(sample), ex=600)
    for dep in deployments:
        live = {
            "ts": ts, "deployment_id": dep.pk, "host": dep.host.name, "state": "ready", "alive": True,
            "ready": True, "num_requests_running": 12.0, "num_requests_waiting": 3.0,
            "kv_cache_usage_perc": 0.61, "num_gpu_blocks": 8192, "block_size": 16,
            "kv_cache_total_tokens": 131072, "prompt_tokens_total": 1.2e9, "generation_tokens_total": 3.4e8,
            "prefix_cache_queries_total": 1.1e9, "prefix_cache_hits_total": 4.4e8, "tokens_per_s": 1432.5,
            "ttft_p50_s": 0.081, "itl_p50_s": 0.021, "ttft_p95_s": 0.412, "itl_p95_s": 0.048,
            "has_metrics": True,
        }  # fmt: skip
        pipe.set(live_deployment_key(dep.pk), json.dumps(live), ex=600)
    day = dt.datetime.now(dt.UTC).strftime("%Y%m%d")
    for t in tenants:
        pipe.set(budget_key(tenant_scope(t.pk), day), 1_234_567, ex=600)
    pipe.execute()

    try:
        body = render()  # warm-up (connections, query compilation)
        times, reads, renders = [], [], []
        for _ in range(options.runs):
            began = time.perf_counter()
            body = render()
            times.append((time.perf_counter() - began) * 1000)
            # The two halves apart, interleaved with the whole: the database and Redis, then the text.
            began = time.perf_counter()
            state = read_state()
            read = time.perf_counter()
            render_state(state)
            reads.append((read - began) * 1000)
            renders.append((time.perf_counter() - read) * 1000)
        baseline_renders: list[float] = []
        interleaved_renders: list[float] = []
        if options.baseline:
            baseline = _load(Path(options.baseline))
            state = read_state()
            # The baseline may predate the read-time family: compared without it.
            stamp = b"inferchain_exposition_read_timestamp_seconds"
            ours = _without(render_state(state), stamp)
            assert _without(baseline.render_state(state), stamp) == ours, "the two renderers disagree"
            for _ in range(options.runs):
                pairs = ((baseline.render_state, baseline_renders), (render_state, interleaved_renders))
                for fn, into in pairs:
                    began = time.perf_counter()
                    fn(state)
                    into.append((time.perf_counter() - began) * 1000)
        # Scrapes as Prometheus makes them, served from the shared render; the first one renders and
        # starts refresh-ahead (Prometheus scrapes all the time: it is not counted).
        factory = RequestFactory()

        def scrape() -> Any:
            request = factory.get(
                "/metrics", HTTP_AUTHORIZATION=f"Bearer {token}", HTTP_ACCEPT_ENCODING="gzip"
            )
            response = metrics_view(request)
            assert response.status_code == 200 and response["Content-Encoding"] == "gzip"
            return response

        gzipped = scrape().content
        stop = threading.Event()

        def worker() -> None:  # beat's routing.refresh_fleet_metrics, as the Celery worker runs it
            try:
                while not stop.wait(0.25):
                    refresh_if_due()
            finally:
                connection.close()

        refresher = threading.Thread(target=worker, daemon=True)
        refresher.start()
        scrapes: list[float] = []
        try:
            for _ in range(options.runs):
                time.sleep(options.scrape_gap)
                began = time.perf_counter()
                gzipped = scrape().content
                scrapes.append((time.perf_counter() - began) * 1000)
        finally:
            stop.set()
            refresher.join()
        if options.profile:
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(options.runs):
                render()
            profiler.disable()
            pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    finally:
        for redis_key in r.scan_iter(match=f"{os.environ['REDIS_KEY_PREFIX']}*", count=1000):
            r.delete(redis_key)
    samples = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    times.sort()
    result = {
        "hosts": options.hosts,
        "gpus": options.hosts * options.gpus,
        "engines": options.engines,
        "tenants": options.tenants,
        "database": connection.vendor,
        "runs": options.runs,
        "median_ms": round(statistics.median(times), 2),
        "p95_ms": round(times[int(0.95 * (len(times) - 1))], 2),
        "max_ms": round(times[-1], 2),
        "read_state_median_ms": round(statistics.median(reads), 2),
        "render_state_median_ms": round(statistics.median(renders), 2),
        **(
            {
                "baseline_render_state_median_ms": round(statistics.median(baseline_renders), 2),
                "render_state_interleaved_median_ms": round(statistics.median(interleaved_renders), 2),
            }
            if baseline_renders
            else {}
        ),
        "scrape_median_ms": round(statistics.median(scrapes), 2),
        "scrape_p95_ms": round(sorted(scrapes)[int(0.95 * (len(scrapes) - 1))], 2),
        "scrape_max_ms": round(max(scrapes), 2),
        "gzip_bytes": len(gzipped),
        "body_bytes": len(body),
        "samples": samples,
    }
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    (BENCH_DIR / "fleet_exposition.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


def _without(body: bytes, family: bytes) -> bytes:
    """The exposition less one family's lines (its HELP, TYPE and samples)."""
    return b"".join(
        line
        for line in body.splitlines(keepends=True)
        if family not in line.split(b" ", 3)[:3] and not line.startswith(family)
    )


def _load(path: Path) -> Any:
    """A module from a file outside the package, registered so its dataclasses resolve their module."""
    spec = importlib.util.spec_from_file_location("fleet_metrics_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    main()
