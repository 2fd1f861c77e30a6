"""One run of the console's alert evaluator (alerts.evaluate) at 100 hosts x 8 GPUs and 400 engines.

    .venv/bin/python benchmarks/alert_evaluation.py [--hosts 100 --gpus 8 --engines 400 --runs 40]

The same inventory and live records as benchmarks/fleet_exposition.py (a scratch SQLite database, or
`--database-url`; Redis under a key prefix of its own, removed at the end), plus what keeps alerts open:
every 10th engine crashed while meant to run (engine_down) and every 10th GPU at 90 °C
(gpu_temperature_high), so each run holds ~120 open alerts (1,300 at 1,000 hosts) as the steady state
of a troubled fleet would. Runs are 15 s apart on the evaluator's clock (the default
ALERT_EVALUATE_INTERVAL_SECONDS), so the Redis windows fill as they would; the first runs open the
alerts pending, later ones fire them. Prints the median, p95 and max of one evaluation (JSON in
var/bench/alert_evaluation.json); `--profile` adds cProfile's top functions over the timed runs, on
stderr; `--phases` the median per run of each part of it (the fleet read, the rules with their series,
the series alone, the state changes), timed by wrapping those functions.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCH_DIR = REPO / "var" / "bench"


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fakefleet import (
        add_fleet_arguments,
        add_heap_argument,
        create_fleet,
        heap_as_in_a_worker,
        setup_django,
    )

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_fleet_arguments(parser)
    add_heap_argument(parser)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument(
        "--profile", action="store_true", help="also print cProfile's top functions over the timed runs"
    )
    parser.add_argument(
        "--phases", action="store_true", help="also report the median time per run of each phase"
    )
    options = parser.parse_args()

    setup_django("alerts", options.database_url, ALERT_WEBHOOK_URL="")
    from django.db import connection

    from alerts.models import Alert
    from alerts.services import evaluate
    from core.redis_client import get_redis
    from nodes.choices import DeploymentState
    from nodes.lifecycle import live_deployment_key, live_gpu_key
    from nodes.models import Host

    fleet = create_fleet(
        "b",
        hosts=options.hosts,
        gpus=options.gpus,
        engines=options.engines,
        gpu_name="H100",
        state_of=lambda d: DeploymentState.CRASHED if d % 10 == 0 else DeploymentState.READY,
    )
    hosts, deployments = fleet.hosts, fleet.deployments

    r = get_redis()
    clock = time.time()

    pipe = r.pipeline(transaction=False)
    for h, host in enumerate(hosts):
        for i in range(options.gpus):
            hot = (h * options.gpus + i) % 10 == 0
            sample = {
                "memory_used_bytes": 72 * 2**30, "memory_total_bytes": 80 * 2**30,
                "utilization_pct": 87.0, "temperature_c": 90.0 if hot else 66.0, "power_watts": 512.5,
            }  # fmt: skip
            pipe.set(live_gpu_key(host.name, i), json.dumps(sample), ex=3600)
    for d, dep in enumerate(deployments):
        if d % 10 == 0:
            continue  # crashed: no live record
        live = {
            "num_requests_running": 12.0, "num_requests_waiting": 3.0, "kv_cache_usage_perc": 0.61,
            "ttft_p95_s": 0.412, "itl_p95_s": 0.048, "tokens_per_s": 1432.5, "has_metrics": True,
        }  # fmt: skip
        pipe.set(live_deployment_key(dep.pk), json.dumps(live), ex=3600)
    pipe.execute()

    # Each phase's milliseconds in the run under way (a function may run more than once a run).
    in_run: dict[str, float] = {}
    phases: dict[str, list[float]] = {}
    if options.phases:
        from alerts import samples, services

        for label, module, name in (
            ("fleet read", services, "read_fleet"),
            ("rules, with their series", services, "observe"),
            ("range series (restarts, queue)", samples, "record_windows"),
            ("TTFT baseline", samples, "record_baselines"),
            ("state changes", services, "_apply"),
        ):
            setattr(module, name, timed(getattr(module, name), label, in_run))

    heap_as_in_a_worker(options.unfrozen_heap)
    times = []
    profiler = cProfile.Profile() if options.profile else None
    try:
        for n in range(options.runs + 1):
            now = clock + 15 * n
            Host.objects.update(last_heartbeat=dt.datetime.fromtimestamp(now, dt.UTC))
            if profiler is not None and n:
                profiler.enable()
            began = time.perf_counter()
            evaluate(now=now)
            if n:  # the first run is the warm-up (connections, query compilation, the fleet rules)
                times.append((time.perf_counter() - began) * 1000)
                for label, ms in in_run.items():
                    phases.setdefault(label, []).append(ms)
            in_run.clear()
            if profiler is not None:
                profiler.disable()
        open_alerts = Alert.objects.exclude(state="resolved").count()
        firing = Alert.objects.filter(state="firing").count()
    finally:
        for redis_key in r.scan_iter(match=f"{os.environ['REDIS_KEY_PREFIX']}*", count=1000):
            r.delete(redis_key)
    if profiler is not None:
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(30)
    times.sort()
    result = {
        "hosts": options.hosts,
        "gpus": options.hosts * options.gpus,
        "engines": options.engines,
        "database": connection.vendor,
        "runs": options.runs,
        "open_alerts": open_alerts,
        "firing_at_end": firing,
        "median_ms": round(statistics.median(times), 2),
        "p95_ms": round(times[int(0.95 * (len(times) - 1))], 2),
        "max_ms": round(times[-1], 2),
        "load_average": os.getloadavg()[0],
        "heap": "unfrozen" if options.unfrozen_heap else "frozen",
    }
    if phases:
        result["phases_median_ms"] = {label: round(statistics.median(ms), 2) for label, ms in phases.items()}
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    (BENCH_DIR / "alert_evaluation.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


def timed(function: Any, label: str, into: dict[str, float]) -> Any:
    """`function`, adding its milliseconds to `into[label]`."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            into[label] = into.get(label, 0.0) + (time.perf_counter() - began) * 1000

    return wrapper


if __name__ == "__main__":
    main()
