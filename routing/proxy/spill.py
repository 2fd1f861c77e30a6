"""Spill: a policy rule's requests overflow onto another pool while that pool has headroom.

A chain policy sends short prompts to a high-throughput pool and long ones to a long-context pool.
Kept strictly apart, the long-context pool idles while the short pool queues: measured on the
simulator (docs/benchmarks.md, heterogeneous chain), that costs the chain its median latency against
plain least-outstanding over every engine. A rule with a spill lets its requests go to the spill pool
instead when all of these hold:

- the rule's own pool is busy: its least-loaded candidate has at least `min_home_inflight` requests
  in flight (this proxy's count);
- a spill endpoint is less loaded than that: fewer in flight than the home pool's least-loaded one;
- that endpoint has headroom left for the requests the pool is there for: fewer than `max_inflight`
  in flight, and, when its live KV-cache state is known, at most `max_kv_used` of its KV cache used
  after this request (stale or missing state: the in-flight cap alone decides).

The caps are what keep the long requests' TTFT: a spilled request never takes an endpoint past
`max_inflight` or `max_kv_used`, so a long prompt always finds the long pool with room, and long
requests themselves never move (only the rule that names a spill spills).

In a policy's rules (JSON):

    {"match": {"max_prompt_tokens": 6000}, "pool": "llama-fast",
     "spill": {"pool": "llama-long", "max_inflight": 6, "max_kv_used": 0.5, "min_home_inflight": 1}}

`decide` is a pure function of the loads, so tests call it directly; the proxy's route step
(routing/proxy/pipeline/route.py, `spill_to`) applies it. This module imports nothing of the proxy's
config, which imports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from routing.proxy.scorers import EndpointLoad

DEFAULT_MAX_INFLIGHT = 6
DEFAULT_MAX_KV_USED = 0.5
DEFAULT_MIN_HOME_INFLIGHT = 1


@dataclass(frozen=True, slots=True)
class Spill:
    """Where a rule's requests may overflow to, and how much of that pool they may take."""

    pool: str
    max_inflight: int = DEFAULT_MAX_INFLIGHT
    max_kv_used: float = DEFAULT_MAX_KV_USED
    min_home_inflight: int = DEFAULT_MIN_HOME_INFLIGHT


def parse_spill(raw: Any) -> Spill | None:
    """A Spill from a rule's "spill" value (None: no spill); raises ValueError on a malformed one."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError("'spill' must be an object with a 'pool'")
    unknown = set(raw) - {"pool", "max_inflight", "max_kv_used", "min_home_inflight"}
    if unknown:
        raise ValueError(f"unknown spill keys: {sorted(unknown)}")
    pool = raw.get("pool")
    if not isinstance(pool, str) or not pool:
        raise ValueError("'spill' needs a 'pool' name")

    def count(name: str, default: int, minimum: int) -> int:
        value = raw.get(name, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ValueError(f"spill '{name}' must be an integer of at least {minimum}")
        return value

    kv = raw.get("max_kv_used", DEFAULT_MAX_KV_USED)
    if isinstance(kv, bool) or not isinstance(kv, int | float) or not 0.0 <= kv <= 1.0:
        raise ValueError("spill 'max_kv_used' must be a number between 0 and 1")
    return Spill(
        pool=pool,
        max_inflight=count("max_inflight", DEFAULT_MAX_INFLIGHT, 1),
        max_kv_used=float(kv),
        min_home_inflight=count("min_home_inflight", DEFAULT_MIN_HOME_INFLIGHT, 0),
    )


def has_headroom(spill: Spill, load: EndpointLoad, tokens_needed: int) -> bool:
    """Whether one spill endpoint may take one more spilled request of `tokens_needed` tokens."""
    if load.inflight >= spill.max_inflight:
        return False
    if load.kv_free_tokens is None or not load.kv_total_tokens:
        return True  # no live KV state: the in-flight cap alone decides
    used_after = load.kv_total_tokens - (load.kv_free_tokens - tokens_needed)
    return used_after <= spill.max_kv_used * load.kv_total_tokens


def decide(
    spill: Spill,
    home: Sequence[EndpointLoad],
    target: Sequence[EndpointLoad],
    tokens_needed: int,
) -> tuple[list[int], str] | None:
    """Indexes into `target` the request may spill to, and why; None keeps it in its own pool."""
    if not home or not target:
        return None
    busy = min(ld.inflight for ld in home)
    if busy < spill.min_home_inflight:
        return None
    ok = [i for i, ld in enumerate(target) if ld.inflight < busy and has_headroom(spill, ld, tokens_needed)]
    if not ok:
        return None
    return ok, f"spill {spill.pool} home_inflight={busy}"
