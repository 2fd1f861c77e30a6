"""Database writes of the charts' history (routing/rollups/) with simulated agents, per beat tick.

    .venv/bin/python benchmarks/rollup_writes.py --database-url postgres://.../scratch \
        [--hosts 100 --gpus 8 --engines 400 --pools 20 --tenants 200 --requests 2000 --ticks 60]

A database of your own (PostgreSQL, whose inventory rows it adds and leaves; default a scratch SQLite
file) gets the inventory: hosts, GPUs, deployments of one model version, route pools and tenants.
Simulated agents then write, before every tick, a fresh live record per GPU and per engine to Redis
(REDIS_URL, a key prefix of its own, removed at the end) in the shape the agent writes, and the proxy's
request-log rows of one 10 s bucket (`--requests` rows over the pools and tenants, a quarter of them long
prompts) are inserted. Each tick runs what beat runs every 10 s (`rollup_tick`), with the minute's 1 min
aggregation after every sixth tick (timed apart: the whole minute in one run and, every other minute, a
slice a run until it is written, as beat runs it) and pruning at the end, over `--ticks` ticks of
simulated time ending now. Every SQL statement the rollup code runs is counted (Django's debug cursor):
writes (INSERT, UPDATE, DELETE, COPY) per tick and per host per 10 s, reads, rows written, and each tick's
time. Budget (issue 21): under one database write per host per 10 s. With --agent-points (default
alternate) the agents also write their host's 10 s point as a real sync does (nodes/tick_points.py),
on every other tick, so the ticks that read those points and the ticks that build them from the live
records are timed interleaved in one run. Then (`--hour-reps`, default 3) the 1 h aggregation on a
full hour of 1 min points, the whole hour in one run against a slice a run as beat runs it
(`routing.aggregate_history_hours`), interleaved, both checked to write the same points. JSON in
var/bench/rollup_writes.json.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime as dt
import json
import os
import pstats
import random
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCH_DIR = REPO / "var" / "bench"
WRITES = ("INSERT", "UPDATE", "DELETE", "COPY")


class StatementCounter:
    """Counts the statements a block runs on a connection, by their first word: what Django's debug
    cursor logs, plus the COPY the rollup code logs there itself (a COPY bypasses execute())."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.writes = 0
        self.reads = 0

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        self.connection.force_debug_cursor = True
        self.connection.queries_log.clear()
        try:
            yield
        finally:
            for query in self.connection.queries_log:
                sql = query["sql"].lstrip().upper()
                if sql.startswith(WRITES) or (sql.startswith("WITH") and "INSERT INTO" in sql):
                    self.writes += 1
                else:
                    self.reads += 1
            self.connection.force_debug_cursor = False


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
    parser.add_argument("--pools", type=int, default=20)
    parser.add_argument("--tenants", type=int, default=200)
    parser.add_argument("--requests", type=int, default=2000, help="request-log rows per 10 s bucket")
    parser.add_argument("--ticks", type=int, default=60)
    parser.add_argument(
        "--agent-points",
        choices=("on", "off", "alternate"),
        default="alternate",
        help="on: each simulated agent also writes its host's 10 s point, as a sync's script does "
        "(nodes/tick_points.py); off: live records only, so the tick builds every point from them "
        "(the in-process supervisor's hosts, and the code before the agent wrote points); alternate: "
        "every other tick each way, interleaved in one run, both reported",
    )
    parser.add_argument(
        "--profile", action="store_true", help="cProfile's top functions of the last ticks and aggregation"
    )
    parser.add_argument(
        "--hour-reps",
        type=int,
        default=3,
        help="then time the 1 h aggregation this many times each way, interleaved: the whole hour in one "
        "run, and a slice of HISTORY_HOUR_HOSTS_PER_RUN hosts a run (as beat runs it), on an hour of 1 min "
        "points made from the last minute's (0: skip)",
    )
    options = parser.parse_args()

    setup_django("rollup", options.database_url)
    from django.conf import settings
    from django.db import connection
    from django.utils import timezone

    from console.models import Tenant
    from core.redis_client import get_redis
    from nodes import tick_points
    from nodes.lifecycle import live_deployment_key, live_gpu_key
    from routing.models import MetricRollup, RequestLog, RoutePool
    from routing.rollups import services
    from routing.services import maintain_request_log

    maintain_request_log()
    fleet = create_fleet(
        "r", hosts=options.hosts, gpus=options.gpus, engines=options.engines, heartbeat=timezone.now()
    )
    tag, hosts, deployments = fleet.tag, fleet.hosts, fleet.deployments
    pools = [p.name for p in RoutePool.objects.bulk_create(
        RoutePool(name=f"r{tag}-pool-{p:02d}", alias=f"chat-{p % 12}") for p in range(options.pools)
    )]  # fmt: skip
    tenants = [
        t.pk
        for t in Tenant.objects.bulk_create(
            Tenant(name=f"r{tag}-tenant-{t:03d}") for t in range(options.tenants)
        )
    ]

    r = get_redis()
    rng = random.Random(7)
    first = services.bucket_start(time.time(), 10) - 10 * options.ticks

    engines_of: dict[int, list[Any]] = {}
    for dep in deployments:
        engines_of.setdefault(dep.host_id, []).append(dep)

    def simulate_agents(ts: float, points: bool) -> None:
        """Every agent's tick: one live record per GPU and per engine (what the rollup reads), and with
        --agent-points on the host's point in the 10 s bucket's hash (one field per host)."""
        pipe = r.pipeline(transaction=False)
        points_key = tick_points.bucket_key(tick_points.bucket_of(ts))
        for host in hosts:
            samples = []
            for i in range(options.gpus):
                # What NVML gives the agent (nodes/agent/gpus.py): whole percent and degrees, memory
                # in bytes (an integer), power in milliwatts.
                sample = {
                    "index": i, "ts": ts, "simulated": False,
                    "utilization_pct": float(rng.randint(20, 100)),
                    "memory_used_bytes": rng.randint(40 * 2**30, 78 * 2**30),
                    "memory_total_bytes": 80 * 2**30, "temperature_c": float(rng.randint(40, 80)),
                    "power_watts": rng.randint(150_000, 700_000) / 1000,
                }  # fmt: skip
                pipe.set(live_gpu_key(host.name, i), json.dumps(sample), ex=600)
                samples.append(sample)
            records = []
            for dep in engines_of.get(host.pk, []):
                live = {
                    "ts": ts, "deployment_id": dep.pk, "state": "ready",
                    "num_requests_running": rng.randint(0, 64), "num_requests_waiting": rng.randint(0, 8),
                    "kv_cache_usage_perc": rng.random(),
                    "tokens_per_s": rng.uniform(0, 3000), "ttft_p95_s": rng.uniform(0.05, 2),
                    "itl_p95_s": rng.uniform(0.01, 0.1), "has_metrics": True,
                }  # fmt: skip
                pipe.set(live_deployment_key(dep.pk), json.dumps(live), ex=600)
                records.append(live)
            if points:
                pipe.hset(points_key, host.name, tick_points.host_point(samples, records))
        pipe.expire(points_key, tick_points.KEEP_SECONDS)
        pipe.execute()

    def proxy_writes(bucket: float) -> None:
        """The proxy's request-log rows of one 10 s bucket (not counted: the proxy writes them)."""
        RequestLog.objects.bulk_create(
            RequestLog(
                created_at=dt.datetime.fromtimestamp(bucket + rng.uniform(0, 9.99), dt.UTC),
                tenant_id=rng.choice(tenants),
                alias="chat",
                route_pool=rng.choice(pools),
                status=200 if rng.random() < 0.98 else 502,
                prompt_tokens=rng.choice((200, 500, 900, 4000)),
                completion_tokens=rng.randint(10, 500),
                latency_ms=rng.lognormvariate(6, 1),
            )
            for _ in range(options.requests)
        )

    minute_per_run = settings.HISTORY_MINUTE_HOSTS_PER_RUN
    heap_as_in_a_worker(options.unfrozen_heap)
    counter = StatementCounter(connection)
    rows_before = MetricRollup.objects.count()
    per_tick: list[dict[str, float]] = []
    aggregate_runs: list[dict[str, Any]] = []
    try:
        for k in range(options.ticks):
            now = first + 10 * k + 3.0
            # The tick reads the points written in the bucket before its own (the agents' last round).
            from_points = k > 0 and (
                options.agent_points == "on" or (options.agent_points == "alternate" and k % 2 == 1)
            )
            alternate = options.agent_points == "alternate"
            writes_points = options.agent_points == "on" or (alternate and k % 2 == 0)
            simulate_agents(now, writes_points)
            if alternate and from_points:
                # The tick before built its points from the live records, at its own bucket: the bucket
                # these points are of. A host's switch from one way to the other meets its own row
                # once (then the COPY falls back to INSERT ... ON CONFLICT); here it would every time,
                # so that tick's rows go first (not timed).
                MetricRollup.objects.filter(
                    resolution_s=10,
                    kind__in=services.PACKED_KINDS,
                    bucket=services._at(services.bucket_start(now, 10) - 10),
                ).delete()
            proxy_writes(services.bucket_start(now, 10) - services.REQUEST_LAG_SECONDS)
            writes, reads = counter.writes, counter.reads
            began = time.perf_counter()
            profiler = cProfile.Profile() if options.profile and k >= options.ticks - 6 else None
            with counter.counting(), profiler or contextlib.nullcontext():
                offered = services.rollup_tick(now)
            tick_ms = (time.perf_counter() - began) * 1000
            if k % 6 == 5:  # the minute's aggregation (beat: a slice every 10 s), timed apart
                # Interleaved: the whole minute in one run (every host in one slice: as before the
                # slices) and a slice a run with HISTORY_MINUTE_HOSTS_PER_RUN, until it is written.
                whole = (k // 6) % 2 == 0
                settings.HISTORY_MINUTE_HOSTS_PER_RUN = 10**9 if whole else minute_per_run
                runs: list[float] = []
                rows = 0
                while len(runs) < 100:
                    began = time.perf_counter()
                    with counter.counting(), profiler or contextlib.nullcontext():
                        aggregated = services.aggregate(60, now)
                    if not aggregated.slices:
                        break
                    runs.append((time.perf_counter() - began) * 1000)
                    rows += aggregated.rows
                settings.HISTORY_MINUTE_HOSTS_PER_RUN = minute_per_run
                aggregate_runs.append({"ms": sum(runs), "rows": rows, "whole": whole, "runs": runs})
            if profiler is not None:
                pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
            per_tick.append(
                {
                    "ms": tick_ms,
                    "writes": counter.writes - writes,
                    "reads": counter.reads - reads,
                    "rows": offered,
                    "from_points": from_points,
                }
            )
        prune_writes = counter.writes
        with counter.counting():
            prune_began = time.perf_counter()
            services.prune(first + 10 * options.ticks)
            prune_ms = (time.perf_counter() - prune_began) * 1000
        prune_writes = counter.writes - prune_writes
        hour = time_hour_aggregation(options.hour_reps, first) if options.hour_reps else {}
    finally:
        for redis_key in r.scan_iter(match=f"{os.environ['REDIS_KEY_PREFIX']}*", count=1000):
            r.delete(redis_key)
    rows_written = MetricRollup.objects.count() - rows_before
    table_bytes = None
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            # A partitioned table's own size is 0: its partitions hold the rows and indexes.
            cursor.execute(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "WHERE c.oid = 'routing_metricrollup'::regclass OR c.oid IN "
                "(SELECT inhrelid FROM pg_inherits WHERE inhparent = 'routing_metricrollup'::regclass)"
            )
            table_bytes = int(cursor.fetchone()[0])
    total_writes = sum(t["writes"] for t in per_tick)
    times = sorted(t["ms"] for t in per_tick)
    agg_times = sorted(a["ms"] for a in aggregate_runs if a["whole"])
    sliced_minutes = [a for a in aggregate_runs if not a["whole"]]
    slice_times = sorted(ms for a in sliced_minutes for ms in a["runs"])
    result = {
        "hosts": options.hosts,
        "gpus": options.hosts * options.gpus,
        "engines": options.engines,
        "pools": options.pools,
        "tenants": options.tenants,
        "requests_per_tick": options.requests,
        "database": connection.vendor,
        "ticks": options.ticks,
        "writes_total": total_writes,
        "writes_per_tick_max": max(t["writes"] for t in per_tick),
        "writes_per_10s_mean": round(total_writes / options.ticks, 3),
        "writes_per_host_per_10s": round(total_writes / options.ticks / options.hosts, 5),
        "reads_per_tick_median": statistics.median(t["reads"] for t in per_tick),
        "rows_per_tick_median": statistics.median(t["rows"] for t in per_tick),
        "rows_written": rows_written,
        "tick_ms_median": round(statistics.median(times), 1),
        "tick_ms_p95": round(times[int(0.95 * (len(times) - 1))], 1),
        "tick_ms_max": round(times[-1], 1),
        "agent_points": options.agent_points,
        "heap": "unfrozen" if options.unfrozen_heap else "frozen",
        # The ticks that read the agents' host points, and those that built every point from the live
        # records, apart (interleaved with --agent-points alternate).
        **{
            f"tick_ms_median_{name}": round(statistics.median(group), 1) if group else None
            for name, group in (
                ("from_points", [t["ms"] for t in per_tick if t["from_points"]]),
                ("from_live_records", [t["ms"] for t in per_tick if not t["from_points"]]),
            )
        },
        **{
            f"tick_ms_p95_{name}": round(sorted(group)[int(0.95 * (len(group) - 1))], 1) if group else None
            for name, group in (
                ("from_points", [t["ms"] for t in per_tick if t["from_points"]]),
                ("from_live_records", [t["ms"] for t in per_tick if not t["from_points"]]),
            )
        },
        "aggregate_runs": len(aggregate_runs),
        "aggregate_rows_median": statistics.median(a["rows"] for a in aggregate_runs or [{"rows": 0}]),
        # The minute in one run (every other minute), and a slice a run as beat runs it (the others).
        "aggregate_ms_median": round(statistics.median(agg_times), 1) if agg_times else None,
        "aggregate_ms_max": round(agg_times[-1], 1) if agg_times else None,
        "minute_slices": statistics.median(len(a["runs"]) for a in sliced_minutes)
        if sliced_minutes
        else None,
        "minute_slice_ms_median": round(statistics.median(slice_times), 1) if slice_times else None,
        "minute_slice_ms_p95": round(slice_times[int(0.95 * (len(slice_times) - 1))], 1)
        if slice_times
        else None,
        "minute_slice_ms_max": round(slice_times[-1], 1) if slice_times else None,
        **hour,
        "prune_writes": prune_writes,
        "prune_ms": round(prune_ms, 1),
        "table_bytes": table_bytes,
    }
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    (BENCH_DIR / "rollup_writes.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


def time_hour_aggregation(reps: int, first: float) -> dict[str, Any]:
    """The 1 h aggregation on a full hour: the ticks above never cross one, so the newest minute's 1 min
    points are copied over the 60 minutes of the hour three hours before the first tick, and
    `aggregate(3600)` runs at that hour's settle time until the hour is done, interleaved: with every
    host and every pool and tenant in one slice each (the whole hour at once, as before the slices: the
    sum of its two runs) and with HISTORY_HOUR_*_PER_RUN a slice (each run timed). Both must write the
    same points; the hour's rows are deleted in between and at the end."""
    from django.conf import settings
    from django.db import connection

    from routing.models import HistoryProgress, MetricRollup
    from routing.rollups import services

    hour = services.bucket_start(first, 3600) - 3 * 3600
    table = MetricRollup._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (resolution_s, kind, subject, bucket, values) "
            f"SELECT 60, kind, subject, %s::timestamptz + make_interval(mins => m), values "
            f"FROM {table}, generate_series(0, 59) AS m WHERE resolution_s = 60 AND bucket = "
            f"(SELECT max(bucket) FROM {table} WHERE resolution_s = 60)",
            [services._at(hour)],
        )
        made = cursor.rowcount
        # As autovacuum would have by then: fresh statistics of the table just filled. Without them the
        # planner took the 133,200 new rows for one and read them all for each pool slice.
        cursor.execute(f"ANALYZE {table}")
    at = services._at(hour)
    now = hour + 3600 + services.SETTLE_SECONDS + 1
    names = ("HISTORY_HOUR_HOSTS_PER_RUN", "HISTORY_HOUR_REQUEST_SUBJECTS_PER_RUN")
    per_run = {name: getattr(settings, name) for name in names}
    whole_ms: list[float] = []
    slice_ms: list[float] = []
    slices: list[int] = []
    outputs: dict[str, set[tuple[str, str, str]]] = {}
    try:
        for _ in range(reps):
            for way in ("whole", "slices"):
                for name in names:
                    setattr(settings, name, 10**9 if way == "whole" else per_run[name])
                runs: list[float] = []
                while len(runs) < 10_000:
                    began = time.perf_counter()
                    result = services.aggregate(3600, now)
                    runs.append((time.perf_counter() - began) * 1000)
                    if result.buckets:
                        break
                if way == "whole":
                    whole_ms.append(sum(runs))
                else:
                    slice_ms.extend(runs)
                    slices.append(len(runs))
                written = MetricRollup.objects.filter(resolution_s=3600, bucket=at)
                outputs[way] = {(k, sub, json.dumps(v, sort_keys=True)) for k, sub, v in
                                written.values_list("kind", "subject", "values")}  # fmt: skip
                written.delete()
                HistoryProgress.objects.filter(resolution_s=3600, bucket=at).delete()
        if outputs["whole"] != outputs["slices"]:
            raise SystemExit("the sliced hour's points differ from the whole hour's")
    finally:
        for name in names:
            setattr(settings, name, per_run[name])
        MetricRollup.objects.filter(
            resolution_s=60, bucket__gte=at, bucket__lt=services._at(hour + 3600)
        ).delete()
    slice_ms.sort()
    return {
        "hour_minute_points_rows": made,
        "hour_points_rows": len(outputs["whole"]),
        "hour_hosts_per_run": per_run[names[0]],
        "hour_request_subjects_per_run": per_run[names[1]],
        "hour_whole_ms_median": round(statistics.median(whole_ms), 1),
        "hour_whole_ms_all": [round(ms, 1) for ms in whole_ms],
        "hour_slices": statistics.median(slices),
        "hour_slice_ms_median": round(statistics.median(slice_ms), 1),
        "hour_slice_ms_p95": round(slice_ms[int(0.95 * (len(slice_ms) - 1))], 1),
        "hour_slice_ms_max": round(slice_ms[-1], 1),
    }


if __name__ == "__main__":
    main()
