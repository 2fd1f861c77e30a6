"""What the proxy's routing snapshot costs to load whole, and to patch for one deployment's change.

    .venv/bin/python benchmarks/routing_snapshot.py [--sizes 1000,5000] [--reps 7]

A scratch PostgreSQL database (created, migrated and dropped here) gets fleets of growing size: hosts of
8 GPUs with 25 vLLM deployments each, serving 12 aliases (benchmarks/fakefleet.py). At each size it
times, in this process, interleaved `--reps` times: a full load (`load_routing_snapshot`: what every
proxy process did for every deployment's change before patches, and still does for an admin's change
and every PROXY_CONFIG_REFRESH_SECONDS), and a patch for one deployment's state change (the database
row changed, then `load_deployments` + `patch_deployments`, as a proxy does on the change message).
Prints the medians (JSON in var/bench/routing_snapshot.json). Results in docs/benchmarks.md
("Routing snapshot: load and patch").

On a checkout without patches (before issue 32's item 3) only the full load is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCH_DIR = REPO / "var" / "bench"


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fakefleet import create_fleet, setup_django

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,5000", help="deployments in the fleet, growing")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--postgres", default="postgres://postgres@127.0.0.1:5432")
    options = parser.parse_args()
    sizes = sorted(int(s) for s in options.sizes.split(",") if s)

    import psycopg

    database = f"bench_snapshot_{os.getpid()}"
    admin_url = options.postgres.rstrip("/") + "/postgres"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    try:
        setup_django("snapshot", options.postgres.rstrip("/") + "/" + database)
        results = measure(sizes, options.reps, create_fleet)
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}"')
    print("| deployments | full load (median) | patch, one deployment (median) | full / patch |")
    print("|---:|---:|---:|---:|")
    for r in results:
        load, patch = r["load_ms"], r["patch_ms"]
        assert isinstance(load, float)
        shown = f"{patch:.2f} ms" if isinstance(patch, float) else "-"
        ratio = f"{load / patch:.0f}x" if isinstance(patch, float) else "-"
        print(f"| {r['deployments']} | {load:.1f} ms | {shown} | {ratio} |")
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    (BENCH_DIR / "routing_snapshot.json").write_text(json.dumps(results, indent=2))


def measure(sizes: list[int], reps: int, create_fleet: Any) -> list[dict[str, object]]:
    from nodes.models import Deployment
    from routing.proxy import config

    patching = hasattr(config, "patch_deployments")
    results: list[dict[str, object]] = []
    have = 0
    for size in sizes:
        # 25 engines a host, 8 GPUs each (so a port per engine index), as fleet_scale.py builds.
        create_fleet("snap", hosts=max(1, (size - have) // 25), gpus=8, engines=size - have)
        have = size
        ids = list(Deployment.objects.order_by("pk").values_list("pk", flat=True))
        loads: list[float] = []
        patches: list[float] = []
        src = config.load_routing_source() if patching else None
        snap = config.build_routing_snapshot(src) if src is not None else None
        for rep in range(reps + 1):
            began = time.perf_counter()
            config.load_routing_snapshot()
            took = time.perf_counter() - began
            if src is not None and snap is not None:
                pk = ids[(rep * 7919) % len(ids)]
                state = "degraded" if rep % 2 == 0 else "ready"
                Deployment.objects.filter(pk=pk).update(state=state)
                began = time.perf_counter()
                snap = config.patch_deployments(src, snap, *config.load_deployments({pk}, set()))
                patch_took = time.perf_counter() - began
                Deployment.objects.filter(pk=pk).update(state="ready")
                snap = config.patch_deployments(src, snap, *config.load_deployments({pk}, set()))
            if rep:  # the first of each is a warm-up
                loads.append(took)
                if patching:
                    patches.append(patch_took)
        results.append(
            {
                "deployments": size,
                "load_ms": statistics.median(loads) * 1000,
                "patch_ms": statistics.median(patches) * 1000 if patches else None,
            }
        )
        print(json.dumps(results[-1]), flush=True)
    return results


if __name__ == "__main__":
    main()
