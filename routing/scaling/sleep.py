"""Idle sleep and scale to zero: which ready engines go to sleep, from the live state the agents report.

A deployment sleeps after `sleep_idle_seconds` with no request running or waiting (its own setting, or
that of a pool it serves; the shortest applies). A pool keeps one engine awake unless the admin chose
`scale_to_zero` for it; then every engine may sleep and the proxy wakes one for the first request
(routing/proxy/wake.py). The decision lives here, beside the pools it reads (routing -> nodes); the
agent does the sleeping (nodes.agent.runtime.sleep), through the single state machine.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from django.db import transaction

from nodes.choices import SLEEP_CAPABLE_ENGINES, DeploymentState, Engine
from nodes.lifecycle import live_deployment_key, read_live_many
from nodes.models import Deployment
from nodes.services import SleepRefused, request_sleep
from routing.models import RoutePool

log = logging.getLogger(__name__)


def serves_pool(deployment: Deployment, alias: str, role: str, version_id: int | None) -> bool:
    """Whether the deployment is one of the pool's engines (the proxy's membership rule)."""
    return (
        deployment.served_model_name == alias
        and (not role or deployment.role == role)
        and (version_id is None or deployment.model_version_id == version_id)
    )


def pool_members(alias: str, role: str = "", version_id: int | None = None) -> list[Deployment]:
    rows = Deployment.objects.filter(served_model_name=alias).select_related("host")
    return [d for d in rows if serves_pool(d, alias, role, version_id)]


def pool_sleep_problem(alias: str, role: str, version_id: int | None) -> str | None:
    """Why the pool's engines cannot sleep (some run an engine without sleep mode), or None."""
    unable = sorted(
        d.name for d in pool_members(alias, role, version_id) if d.engine not in SLEEP_CAPABLE_ENGINES
    )
    if unable:
        return (
            f"Deployments {', '.join(unable)} of this pool run llama.cpp, which has no sleep mode; "
            "serve the pool with vLLM engines only, or leave sleep off."
        )
    return None


def enable_sleep_for_pool(pool: RoutePool) -> list[str]:
    """Mark the pool's engines for sleep mode (it takes effect at their next start); returns the names
    of running ones that must be restarted to get it."""
    if pool.sleep_idle_seconds is None:
        return []
    members = pool_members(pool.alias, pool.role, pool.model_version_id)
    ids = [d.pk for d in members if d.engine != Engine.LLAMACPP and not d.sleep_enabled]
    with transaction.atomic():
        Deployment.objects.filter(pk__in=ids).update(sleep_enabled=True)
    return sorted(d.name for d in members if d.pk in ids and d.pid)


@dataclass
class IdleRule:
    idle_s: float
    level: int
    keep_one_awake: str | None  # the pool's name when it must keep an engine awake


def _rules(deployment: Deployment, pools: list[RoutePool]) -> list[IdleRule]:
    rules = []
    if deployment.sleep_idle_seconds is not None:
        rules.append(IdleRule(deployment.sleep_idle_seconds, deployment.sleep_level, None))
    for pool in pools:
        if pool.sleep_idle_seconds is not None and serves_pool(
            deployment, pool.alias, pool.role, pool.model_version_id
        ):
            keep = None if pool.scale_to_zero else pool.name
            rules.append(IdleRule(pool.sleep_idle_seconds, pool.sleep_level, keep))
    return rules


def sleep_idle_engines(now: float | None = None) -> list[int]:
    """Ask the agents to put engines idle past their threshold to sleep; returns their deployment ids.

    Idle means: the agent's live record says no request running or waiting since `idle_since`. No live
    record (agent silent, Redis down) means unknown: nothing sleeps on a guess.
    """
    now = time.time() if now is None else now
    pools = list(RoutePool.objects.filter(sleep_idle_seconds__isnull=False))
    for pool in pools:
        enable_sleep_for_pool(pool)  # engines deployed into the pool since it was saved
    candidates = Deployment.objects.filter(
        state=DeploymentState.READY, engine__in=list(SLEEP_CAPABLE_ENGINES), sleep_enabled=True
    ).select_related("host")
    # Only engines started with sleep mode can sleep; the others get it at their next start.
    ready = [d for d in candidates if "--enable-sleep-mode" in (d.launch_argv or [])]
    live = read_live_many([live_deployment_key(d.pk) for d in ready])
    # Awake engines per pool that must keep one, counted down as this round puts some to sleep.
    awake: dict[str, int] = {}
    for pool in pools:
        if not pool.scale_to_zero:
            awake[pool.name] = sum(
                1 for d in ready if serves_pool(d, pool.alias, pool.role, pool.model_version_id)
            )
    slept: list[int] = []
    for deployment in sorted(ready, key=lambda d: d.pk):
        rules = _rules(deployment, pools)
        record = live.get(live_deployment_key(deployment.pk))
        if not rules or record is None:
            continue
        busy = (record.get("num_requests_running") or 0) + (record.get("num_requests_waiting") or 0)
        since = record.get("idle_since")
        if busy or not isinstance(since, int | float):
            continue
        idle_for = now - since
        due = [r for r in rules if idle_for >= r.idle_s]
        if not due:
            continue
        keepers = {r.keep_one_awake for r in rules if r.keep_one_awake is not None}
        if any(awake.get(name, 0) <= 1 for name in keepers):
            continue  # the last awake engine of a pool that does not scale to zero
        rule = min(due, key=lambda r: r.idle_s)
        try:
            request_sleep(
                deployment, rule.level, f"Idle for {idle_for:.0f} s (threshold {rule.idle_s:.0f} s)."
            )
        except SleepRefused as exc:
            log.info("not sleeping %s: %s", deployment.name, exc.message)
            continue
        for name in keepers:
            awake[name] -= 1
        slept.append(deployment.pk)
    return slept
