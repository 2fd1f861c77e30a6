"""The fleet at a glance, for a fleet of any size: totals, the hosts that are down, per-pool aggregates and
the worst engines and GPUs, instead of one chart per GPU and engine.

A console of 1,000 hosts and 5,000 engines cannot draw them all (the dashboard drew every GPU and engine
of the first 200 rows, and a down host was only a count), and a Kubernetes or Grafana user expects a
summary there with the detail one click away. Everything here is grouped in PostgreSQL, and the live
values are read in one MGET per kind (engines, GPUs): its cost grows with the fleet, but as a few
queries and two round trips, not as pages of rows.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.db.models import Count, Q
from django.utils import timezone

from nodes.choices import HostState
from nodes.lifecycle import live_deployment_key, live_gpu_key, read_live_many
from nodes.models import Deployment, Gpu, Host

# Deployment states whose engine publishes a live record (nodes.agent_telemetry.LIVE_STATES).
LIVE_STATES = ("starting", "ready", "degraded")
TOP_DEFAULT = 10
TOP_MAX = 100


def down_hosts_filter(now: dt.datetime | None = None) -> Q:
    """Hosts that are not reachable, as `nodes.lifecycle.host_is_reachable` decides it, in SQL."""
    cutoff = (now or timezone.now()) - dt.timedelta(seconds=settings.NODE_UNREACHABLE_SECONDS)
    return Q(state=HostState.UNREACHABLE) | Q(last_heartbeat__isnull=True) | Q(last_heartbeat__lt=cutoff)


def _by_state(rows: Any) -> dict[str, int]:
    return {row["state"]: row["n"] for row in rows.values("state").annotate(n=Count("id")).order_by("state")}


def fleet_summary(top: int = TOP_DEFAULT) -> dict[str, Any]:
    """Totals, hosts down (named, the first `top` by name), per served name (pool) aggregates of the
    engines' live records, and the `top` busiest engines (KV cache) and hottest GPUs (utilization)."""
    hosts_by_state = _by_state(Host.objects.all())
    down = Host.objects.filter(down_hosts_filter())
    down_names = list(down.order_by("name").values_list("name", flat=True)[:top])

    deployments_by_state = _by_state(Deployment.objects.all())
    pools: dict[str, dict[str, Any]] = {}
    for row in (
        Deployment.objects.values("served_model_name")
        .annotate(engines=Count("id"), ready=Count("id", filter=Q(state="ready")))
        .order_by("served_model_name")
    ):
        pools[row["served_model_name"]] = {
            "served_model_name": row["served_model_name"],
            "engines": row["engines"],
            "ready": row["ready"],
            "reporting": 0,
            "running": 0,
            "waiting": 0,
            "tokens_per_s": 0.0,
            "kv_cache_usage_mean": None,
            "kv_cache_usage_max": None,
        }

    engines = list(
        Deployment.objects.filter(state__in=LIVE_STATES).values_list(
            "pk", "name", "served_model_name", "host__name", "state"
        )
    )
    engine_keys = [live_deployment_key(pk) for pk, *_ in engines]
    live = read_live_many(engine_keys)
    busiest: list[dict[str, Any]] = []
    kv_sums: dict[str, float] = {}
    kv_counts: dict[str, int] = {}
    for (pk, name, served, host_name, state), engine_key in zip(engines, engine_keys, strict=True):
        record = live.get(engine_key)
        if record is None:
            continue
        pool = pools[served]
        # An engine without metrics (llama.cpp) reports no KV cache: it is left out of the means, not a 0.
        has_metrics = bool(record.get("has_metrics", True))
        kv = _number(record.get("kv_cache_usage_perc")) if has_metrics else None
        running = int(_number(record.get("num_requests_running")) or 0)
        waiting = int(_number(record.get("num_requests_waiting")) or 0)
        tokens_per_s = _number(record.get("tokens_per_s")) or 0.0
        pool["reporting"] += 1
        pool["running"] += running
        pool["waiting"] += waiting
        pool["tokens_per_s"] += tokens_per_s
        if kv is not None:
            kv_sums[served] = kv_sums.get(served, 0.0) + kv
            kv_counts[served] = kv_counts.get(served, 0) + 1
            pool["kv_cache_usage_max"] = max(kv, pool["kv_cache_usage_max"] or 0.0)
        busiest.append(
            {
                "id": pk,
                "name": name,
                "served_model_name": served,
                "host_name": host_name,
                "state": state,
                "kv_cache_usage_perc": kv,
                "num_requests_running": running,
                "num_requests_waiting": waiting,
                "tokens_per_s": tokens_per_s,
                "has_metrics": has_metrics,
            }
        )
    for served, total in kv_sums.items():
        pools[served]["kv_cache_usage_mean"] = total / kv_counts[served]
    for pool in pools.values():
        pool["tokens_per_s"] = round(pool["tokens_per_s"], 2)
    busiest.sort(key=lambda e: (-(e["kv_cache_usage_perc"] or 0.0), -e["num_requests_waiting"], e["name"]))

    gpus = list(Gpu.objects.values_list("host__name", "index", "name", "memory_total_bytes"))
    gpu_keys = [live_gpu_key(host, index) for host, index, *_ in gpus]
    gpu_live = read_live_many(gpu_keys)
    hottest: list[dict[str, Any]] = []
    for (host_name, index, gpu_name, memory_total), gpu_key in zip(gpus, gpu_keys, strict=True):
        sample = gpu_live.get(gpu_key)
        if sample is None:
            continue
        hottest.append(
            {
                "host_name": host_name,
                "index": index,
                "name": gpu_name,
                "utilization_pct": _number(sample.get("utilization_pct")) or 0.0,
                "temperature_c": _number(sample.get("temperature_c")),
                "memory_used_bytes": int(_number(sample.get("memory_used_bytes")) or 0),
                "memory_total_bytes": memory_total,
            }
        )
    hottest.sort(key=lambda g: (-g["utilization_pct"], g["host_name"], g["index"]))
    return {
        "hosts": {
            "total": sum(hosts_by_state.values()),
            "by_state": hosts_by_state,
            "down": {"count": down.count(), "names": down_names},
        },
        "deployments": {"total": sum(deployments_by_state.values()), "by_state": deployments_by_state},
        "gpus": {"total": len(gpus), "reporting": len(hottest)},
        "pools": list(pools.values()),
        "busiest_engines": busiest[:top],
        "hottest_gpus": hottest[:top],
    }


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
