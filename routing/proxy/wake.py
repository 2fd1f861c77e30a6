"""Wake on request: a request whose pool has only sleeping engines is held while one wakes.

Awake endpoints always come first: the proxy gets here only when the route found no candidate and the
pool has sleeping deployments. It sets the wake key of one of them (the shallowest sleeper, level 1
before level 2: it wakes faster) in Redis, where that host's agent looks every supervisor tick
(nodes.lifecycle.wake_request_key); the agent wakes the engine, confirms it, and moves it to ready,
which reaches every proxy as a config change and a fresh snapshot. The held request then routes as
usual. Past the pool's `wake_timeout_s` it gets a 503 in the OpenAI error shape with Retry-After.

Waiting costs no I/O: the held request re-runs the in-memory route every POLL_S until the snapshot
has a candidate; the wake key is set again every RENEW_S in case it expired or Redis lost it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from nodes.lifecycle import WAKE_REQUEST_TTL_SECONDS, wake_request_key
from routing.proxy.config import Endpoint, Pool
from routing.proxy.errors import ProxyError

log = logging.getLogger(__name__)

POLL_S = 0.02
RENEW_S = 5.0

Route = tuple[Pool, str, list[Endpoint]]


def sleeper_to_wake(pool: Pool) -> Endpoint | None:
    """The sleeping endpoint to wake: the lowest sleep level first (fastest wake), then the lowest id."""
    if not pool.sleeping:
        return None
    return min(pool.sleeping, key=lambda ep: (ep.sleeping_level, ep.deployment_id or 0))


async def ask_wake(redis: Any, endpoint: Endpoint) -> bool:
    """Set the endpoint's wake key; False when Redis could not be told (the hold still waits)."""
    if redis is None or endpoint.deployment_id is None:
        return False
    try:
        await redis.set(
            wake_request_key(endpoint.deployment_id), str(time.time()), ex=WAKE_REQUEST_TTL_SECONDS
        )
    except Exception as exc:  # Redis down: the agent cannot hear us; the timeout answers the client
        log.warning("proxy: could not ask for a wake of deployment %s: %s", endpoint.deployment_id, exc)
        return False
    return True


def waking_error(pool: Pool) -> ProxyError:
    retry = max(1, math.ceil(min(pool.wake_timeout_s, 60.0)))
    return ProxyError(
        503,
        f"Every engine of '{pool.alias}' is asleep and none woke within {pool.wake_timeout_s:g} s; "
        f"one is waking, retry in {retry} s.",
        type="service_unavailable_error",
        code="engine_waking",
        headers=[(b"retry-after", str(retry).encode())],
    )


async def hold_until_awake(redis: Any, pool: Pool, route: Callable[[], Route]) -> Route:
    """Ask for a wake and wait until `route()` finds a candidate; ProxyError 503 at the pool's timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + pool.wake_timeout_s
    renew_at = 0.0
    current = pool
    while True:
        now = loop.time()
        if now >= renew_at:
            target = sleeper_to_wake(current)
            if target is not None:
                await ask_wake(redis, target)
            renew_at = now + RENEW_S
        await asyncio.sleep(min(POLL_S, max(0.0, deadline - now)))
        found = route()
        if found[2]:
            return found
        current = found[0] if found[0].sleeping else current
        if loop.time() >= deadline:
            raise waking_error(pool)
