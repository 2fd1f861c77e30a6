"""The control plane's two beat tasks of every 2 s, one run each, at 1,000 hosts x 8 GPUs and 5,000 engines.

    .venv/bin/python benchmarks/beat_tasks.py --hosts 1000 --gpus 8 --engines 5000 --runs 20 \\
        --database-url postgres://postgres@127.0.0.1:5432/bench_beat_b

(a scratch PostgreSQL database, created and dropped by whoever runs it; without --database-url a scratch
SQLite one). Redis live records go under the benchmark's own key prefix, removed at the end.

The fleet (benchmarks/fakefleet.py): hosts on the agent channel with fresh heartbeats, in --roles roles;
the engines in --pools route pools (one alias each, served by the alias's active version, of the role
of the hosts they run on), each pool with an enabled scaling policy (evaluated every 10 s, the default;
the pools' last evaluations staggered so that a fifth of them is due at each 2 s tick), and every
engine with a live record. Most pools are within their targets (hold); every 10th pool is overloaded
(a scale-up: one engine placed and launched), one overloaded pool is at its maximum (blocked), and
every 10th other pool is idle (quiet, then a drained scale-down once its 20 s cooldown has passed).
A console is open on the fleet page (a member of the live fleet group).

Measured, each as the Celery task's function body called in-process (no broker):

- the unreachable-host sweep (`nodes.check_host_heartbeats`, beat entry nodes-host-heartbeat-sweep):
  before each run --stale-percent of the hosts (1 %: 10 of 1,000, a different 10 each run) are set
  past NODE_UNREACHABLE_SECONDS, the rest fresh, and the previous run's hosts and engines restored;
  each run marks them unreachable and their ready engines degraded. Also timed: the same sweep with
  no stale host (`sweep_idle`, the usual tick).
- the pool autoscaler tick (`nodes.evaluate_scaling`, beat entry nodes-scaling-evaluate): the task's
  body, routing.scaling.autoscaler.evaluate_due, on a clock 2 s further at each run (hosts' heartbeats
  kept fresh between runs).

The first run of each is a warm-up (connections, query compilation), not counted. Prints the median,
p95 and max of one run of each, every run's time and the scaling decisions taken (JSON in
var/bench/beat_tasks.json); `--profile` also writes a cProfile of the timed calls of each task
(var/bench/beat_tasks.sweep.prof, beat_tasks.scaling.prof).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime as dt
import json
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCH_DIR = REPO / "var" / "bench"


def summary(times: list[float]) -> dict[str, Any]:
    ordered = sorted(times)
    return {
        "median_ms": round(statistics.median(ordered), 2),
        "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))], 2),
        "max_ms": round(ordered[-1], 2),
        "each_ms": [round(t, 1) for t in times],
    }


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
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--pools", type=int, default=50, help="route pools with a scaling policy")
    parser.add_argument("--roles", type=int, default=10, help="host roles (each pool has one)")
    parser.add_argument("--stale-percent", type=float, default=1.0, help="hosts past the bound per sweep")
    parser.add_argument(
        "--profile", action="store_true", help="cProfile the timed calls: var/bench/beat_tasks.<task>.prof"
    )
    options = parser.parse_args()
    if options.hosts % options.pools or options.pools % options.roles:
        parser.error("--hosts must be a multiple of --pools, and --pools of --roles")

    tmp = setup_django("beat", options.database_url)
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer
    from django.conf import settings
    from django.db import connection

    from core.live import FLEET_GROUP
    from core.redis_client import get_redis
    from models_registry.models import ModelAlias
    from models_registry.services import read_architecture
    from nodes.choices import DeploymentState, HostState
    from nodes.demo import LLAMA_31_8B_CONFIG, write_config_dir
    from nodes.lifecycle import live_deployment_key
    from nodes.models import Deployment, Host
    from nodes.tasks import check_host_heartbeats
    from routing.models import RoutePool
    from routing.scaling import autoscaler
    from routing.scaling.models import ScalingDecision, ScalingPolicy

    def fresh() -> None:
        """Every host online with a heartbeat now."""
        Host.objects.update(state=HostState.ONLINE, last_heartbeat=dt.datetime.now(dt.UTC))

    fleet = create_fleet(
        "t",
        hosts=options.hosts,
        gpus=options.gpus,
        engines=options.engines,
        heartbeat=dt.datetime.now(dt.UTC),
    )
    hosts, deployments = fleet.hosts, fleet.deployments
    # The version's config.json as the registry reads it, so that the fit check of a placement runs.
    version = fleet.version
    version.architecture, version.parameter_count, version.max_context, _ = read_architecture(
        write_config_dir(tmp / "llama", LLAMA_31_8B_CONFIG), version.source_kind
    )
    version.save()
    # Agents on the agent channel: the scaler's launches and drains are read at their next sync, not queued.
    Host.objects.update(state=HostState.ONLINE, agent_info={"channel": "api"})
    for role in range(options.roles):
        Host.objects.filter(pk__in=[h.pk for h in hosts[role :: options.roles]]).update(role=f"role-{role}")
    # Engine d runs on host d % hosts, so each host's engines are all of pool (d % pools): a pool's
    # engines are on hosts of one role.
    pools: list[Any] = []
    for p in range(options.pools):
        alias = f"pool-{p:02d}"
        members = [d.pk for d in deployments[p :: options.pools]]
        Deployment.objects.filter(pk__in=members).update(
            served_model_name=alias, role=f"role-{p % options.roles}"
        )
        ModelAlias.objects.create(name=alias, active_version=fleet.version)
        pools.append(RoutePool.objects.create(name=alias, alias=alias, role=f"role-{p % options.roles}"))
    per_pool = options.engines // options.pools

    # Load per pool (what the agents publish each second): most within the targets, every 10th pool
    # overloaded (2.1 waiting per engine > 2), every 10th other one idle.
    def load(p: int) -> dict[str, float]:
        if p % 10 == 1 or p == 3:
            return {"num_requests_running": 16.0, "num_requests_waiting": 2.1, "kv_cache_usage_perc": 0.72}
        if p % 10 == 2:
            return {"num_requests_running": 1.0, "num_requests_waiting": 0.0, "kv_cache_usage_perc": 0.05}
        return {"num_requests_running": 12.0, "num_requests_waiting": 1.0, "kv_cache_usage_perc": 0.6}

    clock = dt.datetime.now(dt.UTC).replace(microsecond=0)
    for p, pool in enumerate(pools):
        ScalingPolicy.objects.create(
            pool=pool,
            template=deployments[p],
            min_engines=1,
            # Pool 3 is overloaded at its maximum: blocked.
            max_engines=per_pool if p == 3 else per_pool + 28,
            scale_down_cooldown_s=20,
            evaluation_interval_s=10,
            # Due at the tick p % 5 (ticks are 2 s apart, the interval 10 s).
            last_evaluated_at=clock - dt.timedelta(seconds=10 - 2 * (p % 5)),
        )
    # A console open (every console joins the live fleet group): the sweep's pushes to the fleet group
    # have a listener. It reads what it was sent between runs (the layer is emptied, the console joins
    # again), so its channel never reaches the layer's capacity.
    layer = get_channel_layer()

    def console_listens() -> None:
        async_to_sync(layer.flush)()
        async_to_sync(layer.group_add)(FLEET_GROUP, async_to_sync(layer.new_channel)())

    r = get_redis()
    pipe = r.pipeline(transaction=False)
    for d, dep in enumerate(deployments):
        live = {"deployment_id": dep.pk, "state": "ready", "ttft_p95_s": 0.41, **load(d % options.pools)}
        pipe.set(live_deployment_key(dep.pk), json.dumps(live), ex=3600)
    pipe.execute()

    profiles: dict[str, cProfile.Profile] = {}

    @contextlib.contextmanager
    def profiled(task: str, n: int) -> Iterator[None]:
        if not options.profile or not n:
            yield
            return
        profile = profiles.setdefault(task, cProfile.Profile())
        profile.enable()
        try:
            yield
        finally:
            profile.disable()

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")  # planner statistics, as autovacuum keeps them on a live database

    stale_count = max(1, round(options.hosts * options.stale_percent / 100))
    bound = settings.NODE_UNREACHABLE_SECONDS
    sweep_times: list[float] = []
    heap_as_in_a_worker(options.unfrozen_heap)
    idle_times: list[float] = []
    scale_times: list[float] = []
    swept: list[int] = []
    degraded: list[int] = []
    actions: Counter[str] = Counter()
    due_per_tick: list[int] = []
    try:
        # --- the sweep ---------------------------------------------------------------------------
        previous: list[int] = []
        for n in range(options.runs + 1):
            # Untimed: the agents of the previous run's hosts came back, and this run's went silent.
            if previous:
                Deployment.objects.filter(host_id__in=previous, state=DeploymentState.DEGRADED).update(
                    state=DeploymentState.READY
                )
            fresh()
            console_listens()
            picked = [hosts[(n * stale_count + i) * 7 % len(hosts)].pk for i in range(stale_count)]
            Host.objects.filter(pk__in=picked).update(
                last_heartbeat=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=bound + 5)
            )
            began = time.perf_counter()
            with profiled("sweep", n):
                names = check_host_heartbeats.run()
            elapsed = (time.perf_counter() - began) * 1000
            if n:
                sweep_times.append(elapsed)
                swept.append(len(names))
                degraded.append(
                    Deployment.objects.filter(host_id__in=picked, state=DeploymentState.DEGRADED).count()
                )
            previous = picked
            # The usual tick: nothing newly stale.
            began = time.perf_counter()
            assert check_host_heartbeats.run() == []
            if n:
                idle_times.append((time.perf_counter() - began) * 1000)
        Deployment.objects.filter(host_id__in=previous, state=DeploymentState.DEGRADED).update(
            state=DeploymentState.READY
        )

        # --- the autoscaler tick ----------------------------------------------------------------
        for n in range(options.runs + 1):
            fresh()
            now = clock + dt.timedelta(seconds=2 * n)
            due_per_tick.append(len(autoscaler.due_policy_ids(now)))
            before = ScalingDecision.objects.count()
            began = time.perf_counter()
            with profiled("scaling", n):
                autoscaler.evaluate_due(now=now)
            elapsed = (time.perf_counter() - began) * 1000
            if n:
                scale_times.append(elapsed)
            for action in ScalingDecision.objects.order_by("id")[before:].values_list("action", flat=True):
                actions[action] += 1
    finally:
        for redis_key in r.scan_iter(match=f"{os.environ['REDIS_KEY_PREFIX']}*", count=1000):
            r.delete(redis_key)

    result = {
        "hosts": options.hosts,
        "gpus": options.hosts * options.gpus,
        "engines": options.engines,
        "database": connection.vendor,
        "runs": options.runs,
        "load_average": os.getloadavg()[0],
        "heap": "unfrozen" if options.unfrozen_heap else "frozen",
        "sweep": {
            "stale_hosts_per_run": stale_count,
            "hosts_marked_per_run": statistics.median(swept),
            "engines_degraded_per_run": statistics.median(degraded),
            **summary(sweep_times),
        },
        "sweep_idle": summary(idle_times),
        "scaling": {
            "pools": options.pools,
            "engines_per_pool": per_pool,
            "host_roles": options.roles,
            "policies_due_per_tick": statistics.median(due_per_tick),
            "decisions": dict(actions),
            **summary(scale_times),
        },
    }
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    for task, profile in profiles.items():
        profile.dump_stats(BENCH_DIR / f"beat_tasks.{task}.prof")
    (BENCH_DIR / "beat_tasks.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
