"""What lets a routine agent sync skip Django: each host's generation number and its sync snapshot.

A routine sync (heartbeat, GPU samples, engine live records; no queued change, no new inventory) needs
nothing from PostgreSQL if nothing about the host changed since its agent's last full answer. So:

- Every write that can change what a host's agent is told (a deployment of it saved or updated, its
  GPUs, its Ray memberships, the host row beyond its heartbeat, a token revoked, a drain or a log tail
  asked for) bumps the host's **generation**, a Redis counter, once its transaction has committed.
- A full sync (nodes.agent_channel.sync, the Django path) reads the generation *before* it reads the
  database, answers with it, and leaves a **snapshot** in Redis: that generation, the digest of the
  token it authenticated, the agent's info, each deployment's name and state, the GPU indices, and the
  time until which nothing in it falls due (a crashed engine's restart, a stable-after-restart reset).
- The ingest (nodes.agent_ingest) answers the next syncs itself, from one MGET, while the agent echoes
  that generation, the counter still holds it, the token and info match and nothing fell due; anything
  else goes the full path. Reading the counter first means a change committed while a full sync runs
  leaves a snapshot that is already stale, never one that hides the change.

Hosts whose answer depends on more than their own rows (a Ray or multi-host member, a sleeping engine
that may be woken, a launch under way) get no snapshot: every one of their syncs is a full one. And a
snapshot lives at most AGENT_SNAPSHOT_SECONDS, so a write path that forgot to bump heals by itself.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.db import transaction

from core.redis_client import get_redis, key

log = logging.getLogger("nodes.agent_generation")

# Deployment states whose answer can change without a write of ours: a launch being prepared (file
# checks, the fit check), and a sleeping engine a held request may wake (a Redis flag).
FULL_SYNC_STATES = ("pending", "verifying", "sleeping")
# Host rows written at every heartbeat; a write of only these changes nothing the agent is told.
HEARTBEAT_FIELDS = frozenset({"last_heartbeat", "agent_info", "updated_at"})


def generation_key(host_name: str) -> str:
    return key("agent", "gen", host_name)


def snapshot_key(host_name: str) -> str:
    return key("agent", "snap", host_name)


def bump(host_names: Iterable[str], *, at_once: bool = False) -> None:
    """Bump these hosts' generations once the current transaction commits (at once outside one).

    After the commit, not before: a full sync that read the old rows must have read the old number too.
    `at_once` for a change that lives in Redis only (a log request), which a caller may wait on.
    """
    names = sorted({n for n in host_names if n})
    if not names:
        return

    def send() -> None:
        try:
            pipe = get_redis().pipeline(transaction=False)
            for name in names:
                pipe.incr(generation_key(name))
                pipe.delete(snapshot_key(name))
            pipe.execute()
        except Exception as exc:  # the snapshot's own lifetime bounds how long this can go unseen
            log.warning("could not bump the agent generation of %s: %s", ", ".join(names), exc)

    if at_once:
        send()
    else:
        transaction.on_commit(send)


def current(host_name: str) -> int:
    """The host's generation now (0 before its first bump; Redis down: -1, which matches no snapshot)."""
    try:
        raw = get_redis().get(generation_key(host_name))
    except Exception:
        return -1
    return int(raw) if raw is not None else 0


def snapshot_for(
    host: Any,
    deployments: Iterable[Any],
    gpu_indices: Iterable[int],
    *,
    generation: int,
    token_digest: str,
    info: dict[str, Any],
    always_full: bool,
) -> dict[str, Any] | None:
    """The snapshot a full sync leaves, or None when this host's syncs must all be full ones.

    `host` and `deployments` are the rows (nodes.models, which imports this module, hence no types)."""
    if generation < 0 or always_full or host.state in ("unknown", "unreachable"):
        return None
    now = time.time()
    due = now + settings.AGENT_SNAPSHOT_SECONDS
    described: dict[str, list[str]] = {}
    for deployment in deployments:
        if deployment.state in FULL_SYNC_STATES:
            return None
        if deployment.state == "crashed" and deployment.desired_state == "running":
            if deployment.next_restart_at is None:
                return None
            due = min(due, deployment.next_restart_at.timestamp())
        if deployment.state == "ready" and deployment.restart_count and deployment.ready_at:
            due = min(due, deployment.ready_at.timestamp() + settings.NODE_STABLE_SECONDS)
        described[str(deployment.pk)] = [deployment.name, deployment.state]
    if due <= now:
        return None
    return {
        "generation": generation,
        "token": token_digest,
        "info": info,
        "due": due,
        "heartbeat_at": host.last_heartbeat.timestamp() if host.last_heartbeat else 0.0,
        "deployments": described,
        "gpus": sorted(set(gpu_indices)),
    }


def store(host_name: str, snapshot: dict[str, Any] | None) -> None:
    try:
        redis = get_redis()
        if snapshot is None:
            redis.delete(snapshot_key(host_name))
        else:
            ttl = max(1, int(snapshot["due"] - time.time()) + 1)
            redis.set(snapshot_key(host_name), json.dumps(snapshot), ex=ttl)
    except Exception as exc:  # without a snapshot every sync is a full one: slower, still right
        log.warning("could not store the sync snapshot of host %s: %s", host_name, exc)
