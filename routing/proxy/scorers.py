"""Endpoint scorers: pure functions from (candidate loads, request) to a chosen index and a reason.

The proxy keeps the loads (its own in-flight counts plus engine KV-cache state no older than
`STALE_AFTER_S`); these functions only decide, so tests call them directly.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from routing.choices import Scorer
from routing.proxy.predict import EndpointModel

# Bounded-load consistent hashing: no endpoint takes more than (1 + epsilon) x the average load.
LOAD_BOUND_EPSILON = 0.25
# The affinity scorers keep that bound, and a floor under it: a key's home engine may also hold up to
# AFFINITY_SLACK requests more than the average before one is moved. A moved request lands where its
# prefix (or session) is likely cold and pays its whole prefill there, a fixed cost whatever the load, so
# the floor is a fixed number of requests too: at a handful in flight per engine, 1.25x the average is
# one or two requests, and it moved a third of a prefix-heavy workload off its warm engines (48 tenants on
# 4 engines at 16 clients: 1.80x round robin's tokens/s and 1.36x lower p90 TTFT, against 2.29x and 10.9x
# with 2x the average, docs/benchmarks.md, "Prefix-heavy"). Unlike a larger epsilon, the floor does not
# let two engines absorb one hot prefix for ever: at (1 + epsilon) x the average a key spreads over all N
# engines only while 1 + epsilon < N / (N - 1), and the floor adds a constant, which the relative bound
# outgrows as the load does (tests/routing/test_prefix_blocks.py).
AFFINITY_EPSILON = LOAD_BOUND_EPSILON
AFFINITY_SLACK = 4
# Prefix affinity keys on the prompt's leading full blocks of PREFIX_BLOCK_TOKENS tokens (vLLM's default
# block size, the unit its prefix cache shares), up to PREFIX_BLOCKS blocks.
PREFIX_BLOCK_TOKENS = 16
PREFIX_BLOCKS = 16
PREFIX_TOKENS = PREFIX_BLOCK_TOKENS * PREFIX_BLOCKS
# Without a tokenizer, character blocks stand in for token blocks (about four characters per token).
PREFIX_BLOCK_CHARS = 4 * PREFIX_BLOCK_TOKENS
# The `random` scorer's own generator: seeded (PROXY_RANDOM_SEED, `seed_random`) it makes the same
# sequence of draws in every run, so a benchmark of it can be repeated; the module's shared generator
# is left to others (canary and shadow draws).
_rng = random.Random()


@dataclass(slots=True)
class EndpointLoad:
    """What a scorer sees of one endpoint."""

    endpoint_id: str
    inflight: int = 0
    # Free KV-cache tokens net of what this proxy dispatched since the engine's last sample;
    # None when the engine's live state is missing or stale (counts as busy).
    kv_free_tokens: int | None = None
    kv_total_tokens: int | None = None
    max_inflight: int = 64
    # For the predicted scorers: the engine's learnt latency model (routing/proxy/predict.py) and its
    # share of its host's cost per hour.
    model: EndpointModel | None = None
    cost_per_hour: float = 0.0


@dataclass(slots=True)
class ScoreRequest:
    tokens_needed: int = 0
    prefix_key: bytes | None = None
    session_key: str | None = None
    # For the predicted scorers: prompt tokens, the output tokens expected (predict.Predictors
    # .output_tokens), and the SLO class's targets in seconds (None: no target).
    prompt_tokens: int = 0
    output_tokens: int = 1
    ttft_target_s: float | None = None
    tpot_target_s: float | None = None
    # Refuse (SloUnmet) rather than send a request no engine is predicted to meet (the batch class).
    shed_unmet: bool = False
    # Raise SloUnmet too when the request has somewhere else to go (the policy's fallback pool).
    fallback_unmet: bool = False


class SloUnmet(Exception):
    """No candidate is predicted to meet the request's SLO class and the class says shed it."""


def token_prefix_key(ids: Sequence[int]) -> bytes | None:
    """The routing key of a prompt's leading token ids: one hash of its first full blocks.

    Up to PREFIX_BLOCKS blocks of PREFIX_BLOCK_TOKENS; a prompt shorter than one block gets no key.
    Two prompts share the key exactly when they share those blocks, which is what vLLM's hash of the
    last of them (chained through its parents) identifies; the intermediate hashes of that chain are
    never looked at here, so they are not computed.
    """
    full = min(len(ids), PREFIX_TOKENS) // PREFIX_BLOCK_TOKENS
    if not full:
        return None
    # Python's hash of a tuple of ints is the same in every process (PYTHONHASHSEED only salts str and
    # bytes), like vLLM's `builtin` prefix-cache hash, and costs a third of packing the ids for blake2b.
    return hash(tuple(ids[: full * PREFIX_BLOCK_TOKENS])).to_bytes(8, "little", signed=True)


def prefix_key(text: str) -> bytes | None:
    """The routing key of a prompt's leading text, for versions without a known tokenizer.

    Character blocks of PREFIX_BLOCK_CHARS (about PREFIX_BLOCK_TOKENS tokens) stand in for token
    blocks: one hash of the first full ones, up to PREFIX_BLOCKS; a prompt shorter than one block
    gets no key.
    """
    full = min(len(text), PREFIX_BLOCKS * PREFIX_BLOCK_CHARS) // PREFIX_BLOCK_CHARS
    if not full:
        return None
    cut = text[: full * PREFIX_BLOCK_CHARS].encode("utf-8", errors="replace")
    return hashlib.blake2b(cut, digest_size=16, person=b"chars").digest()


def _hrw_weights(key: bytes, loads: Sequence[EndpointLoad]) -> list[bytes]:
    return [hashlib.blake2b(key + ld.endpoint_id.encode(), digest_size=8).digest() for ld in loads]


def _hrw_order(key: bytes, loads: Sequence[EndpointLoad]) -> list[int]:
    """Rendezvous (highest random weight) order: stable per key, minimal movement when endpoints change."""
    weights = _hrw_weights(key, loads)
    return sorted(range(len(loads)), key=weights.__getitem__, reverse=True)


def _hrw_home(key: bytes, loads: Sequence[EndpointLoad]) -> int:
    weights = _hrw_weights(key, loads)
    return max(range(len(loads)), key=weights.__getitem__)


def _load_bound(loads: Sequence[EndpointLoad], epsilon: float = LOAD_BOUND_EPSILON, slack: int = 0) -> int:
    """In-flight count an endpoint must stay under to take one more request: (1 + epsilon) x the average
    with this request counted, and at least `slack` requests above the average."""
    average = (sum(ld.inflight for ld in loads) + 1) / len(loads)
    return max(1, math.ceil(average * (1 + epsilon)), math.ceil(average) + slack)


def least_outstanding(loads: Sequence[EndpointLoad], rr: int = 0) -> int:
    best = min(ld.inflight for ld in loads)
    ties = [i for i, ld in enumerate(loads) if ld.inflight == best]
    return ties[rr % len(ties)]


def round_robin(loads: Sequence[EndpointLoad], rr: int) -> tuple[int, str]:
    return rr % len(loads), "round_robin"


def seed_random(seed: int) -> None:
    """Fix the `random` scorer's sequence of draws (which endpoint a request gets still depends on the
    order requests arrive in)."""
    _rng.seed(seed)


def pick_random(loads: Sequence[EndpointLoad], rr: int) -> tuple[int, str]:
    return _rng.randrange(len(loads)), "random"


def pick_least_outstanding(loads: Sequence[EndpointLoad], rr: int) -> tuple[int, str]:
    i = least_outstanding(loads, rr)
    return i, f"least_outstanding inflight={loads[i].inflight}"


def best_fit(loads: Sequence[EndpointLoad], req: ScoreRequest, rr: int = 0) -> tuple[int, str]:
    """The endpoint whose free KV tokens cover the request with the least left over, among those not
    loaded past the bound of bounded-load hashing ((1 + LOAD_BOUND_EPSILON) x the average in flight).

    Without the bound, tightest fit piles every request onto the fullest engine that still fits while
    the others idle: measured with live KV state on the simulator (docs/benchmarks.md, routing
    scenarios), it gave a third of least-outstanding's goodput on three engines and a twentieth on four,
    since a decode batch slows long before its KV cache is full. Within the bound it still packs, which
    keeps the most headroom free elsewhere for a long prompt."""
    fitting = [
        (ld.kv_free_tokens - req.tokens_needed, i)
        for i, ld in enumerate(loads)
        if ld.kv_free_tokens is not None and ld.kv_free_tokens >= req.tokens_needed
    ]
    if fitting:
        bound = _load_bound(loads)
        within = [(left, i) for left, i in fitting if loads[i].inflight < bound]
        if not within:
            i = min(fitting, key=lambda f: (loads[f[1]].inflight, f[0]))[1]
            return i, f"best_fit over_bound inflight={loads[i].inflight}"
        leftover, i = min(within)
        return i, f"best_fit leftover={leftover}"
    fresh = [(ld.kv_free_tokens, i) for i, ld in enumerate(loads) if ld.kv_free_tokens is not None]
    if fresh:
        # Nobody fits right now: the most free space queues the least.
        _, i = max(fresh)
        return i, "best_fit none_fit most_free"
    i = least_outstanding(loads, rr)
    return i, "best_fit no_live_state least_outstanding"


def affinity(loads: Sequence[EndpointLoad], key: bytes | None, label: str, rr: int) -> tuple[int, str]:
    """Consistent hashing of `key` with bounded load (AFFINITY_SLACK above the average at least); without a
    key, least outstanding."""
    if key is None:
        i = least_outstanding(loads, rr)
        return i, f"{label} no_key least_outstanding"
    bound = _load_bound(loads, AFFINITY_EPSILON, AFFINITY_SLACK)
    weights = _hrw_weights(key, loads)
    home = max(range(len(loads)), key=weights.__getitem__)
    if loads[home].inflight < bound:  # the common case: no sort needed
        return home, f"{label} rank=0"
    order = sorted(range(len(loads)), key=weights.__getitem__, reverse=True)
    for rank, i in enumerate(order):
        if loads[i].inflight < bound:
            return i, f"{label} rank={rank}"
    i = least_outstanding(loads, rr)
    return i, f"{label} all_over_bound least_outstanding"


def weighted(
    loads: Sequence[EndpointLoad], req: ScoreRequest, weights: dict[str, float], rr: int = 0
) -> tuple[int, str]:
    """Lowest weighted cost: load (in-flight share), kv (used KV share; stale = full), prefix (not home)."""
    w_load = weights.get("load", 1.0)
    w_kv = weights.get("kv", 1.0)
    w_prefix = weights.get("prefix", 0.0)
    home = _hrw_home(req.prefix_key, loads) if req.prefix_key is not None and w_prefix else -1
    best_cost = math.inf
    best = 0
    for i, ld in enumerate(loads):
        cost = w_load * ld.inflight / max(1, ld.max_inflight)
        if ld.kv_free_tokens is None or not ld.kv_total_tokens:
            cost += w_kv
        else:
            cost += w_kv * (1.0 - max(0, ld.kv_free_tokens - req.tokens_needed) / ld.kv_total_tokens)
        if home >= 0 and i != home:
            cost += w_prefix
        if cost < best_cost - 1e-12 or (abs(cost - best_cost) <= 1e-12 and (i - rr) % len(loads) == 0):
            best_cost, best = cost, i
    return best, f"weighted cost={best_cost:.3f}"


def _predictions(loads: Sequence[EndpointLoad], req: ScoreRequest) -> list[tuple[float, float, float]] | None:
    """(TTFT, TPOT, completion) predicted on each candidate, or None while any is cold (too few
    samples): then the predicted scorers decide as least-outstanding does, which spreads requests and
    so warms every engine. The queue a request joins is in each model's kept base (what this process
    has in flight there, EndpointModel.refresh): per candidate two multiply-adds, a log, two exps, a
    dict lookup for the prefix it may hold and two clamps to the range it has shown."""
    out: list[tuple[float, float, float]] = []
    prompt, key, more = req.prompt_tokens, req.prefix_key, max(0, req.output_tokens - 1)
    whole = math.log1p(prompt / 1000.0)
    exp, log1p = math.exp, math.log1p
    # Written out (not EndpointModel.ttft_for / tpot_for, which compute the same): a method call per
    # candidate was a third of the decision with 16 endpoints.
    for ld in loads:
        m = ld.model
        if m is None or not m.warm:
            return None
        if m.stale:
            m.refresh()
        # The part of the prompt this engine likely has not cached (its model remembers prefix keys).
        lp = whole if key is None or key not in m.prefixes else log1p(m.uncached(prompt, key) / 1000.0)
        v = m.ttft_base + m.ttft_per_kprompt * lp
        ttft = exp(v if v < 30.0 else 30.0)
        ttft = m.ttft_lo if ttft < m.ttft_lo else m.ttft_hi if ttft > m.ttft_hi else ttft
        total, free = ld.kv_total_tokens, ld.kv_free_tokens
        v = m.tpot_base + (m.tpot_per_kv * (1.0 - free / total) if total and free is not None else 0.0)
        tpot = exp(v if v < 30.0 else 30.0)
        tpot = m.tpot_lo if tpot < m.tpot_lo else m.tpot_hi if tpot > m.tpot_hi else tpot
        out.append((ttft, tpot, ttft + tpot * more))
    return out


def predicted_latency(loads: Sequence[EndpointLoad], req: ScoreRequest, rr: int = 0) -> tuple[int, str]:
    """The endpoint where the request is predicted to complete soonest: TTFT, plus TPOT times the
    output tokens expected, each from the engine's own model learnt online with the queue it joins
    (routing/proxy/predict.py). Completion, not TTFT, even for streams: ranking by TTFT alone sends
    every stream to the engine with the fastest prefill however slow its decode batch has become."""
    preds = _predictions(loads, req)
    if preds is None:
        i = least_outstanding(loads, rr)
        return i, f"predicted_latency cold least_outstanding inflight={loads[i].inflight}"
    best = preds[0]
    i = 0
    for k, p in enumerate(preds):
        if p[2] < best[2]:
            best, i = p, k
    ttft, tpot, e2e = best
    return i, f"predicted_latency e2e={e2e:.3f}s ttft={ttft:.3f}s tpot={tpot * 1000:.1f}ms"


def slo_cost(loads: Sequence[EndpointLoad], req: ScoreRequest, rr: int = 0) -> tuple[int, str]:
    """The cheapest endpoint predicted to meet the request's TTFT and TPOT targets, by cost per output
    token (its host's cost per hour over the best throughput it has shown; before it has shown one,
    over one stream's rate, 1 / TPOT); ties and free hosts by soonest completion. When none is
    predicted to meet them: SloUnmet if the class sheds (batch) or the request may move (to the
    policy's fallback pool, `fallback_unmet`), else the soonest completion.

    "Predicted to meet" keeps a margin that grows with the engine's recent error: its prediction times
    (1 + its recent MAPE, at most predict.SLO_MARGIN_MAX: `EndpointModel.ttft_margin`, `tpot_margin`)
    must meet the target. Without it (measured in the
    mixed scenario, docs/benchmarks.md) it packed the standard class onto the cheapest engine whose
    predictions, off by tens of percent, put it just under 2 s, and lost 40 % of the goodput."""
    preds = _predictions(loads, req)
    if preds is None:
        i = least_outstanding(loads, rr)
        return i, f"slo_cost cold least_outstanding inflight={loads[i].inflight}"
    ttft_t = req.ttft_target_s if req.ttft_target_s is not None else math.inf
    tpot_t = req.tpot_target_s if req.tpot_target_s is not None else math.inf
    best: tuple[float, float] | None = None
    pick = -1
    for i, (ttft, tpot, e2e) in enumerate(preds):
        ld = loads[i]
        assert ld.model is not None
        m = ld.model
        if ttft * m.ttft_margin > ttft_t or tpot * m.tpot_margin > tpot_t:
            continue
        per_token = ld.model.cost_per_token(ld.cost_per_hour)
        if per_token is None:
            per_token = ld.cost_per_hour / 3600.0 * tpot
        key = (per_token, e2e)
        if best is None or key < best:
            best, pick = key, i
    if best is not None:
        return pick, f"slo_cost cheapest_meeting cost_per_1k={best[0] * 1000:.5f} e2e={best[1]:.3f}s"
    if req.shed_unmet or req.fallback_unmet:
        raise SloUnmet
    i = min(range(len(preds)), key=lambda k: preds[k][2])
    return i, f"slo_cost none_meet fastest e2e={preds[i][2]:.3f}s"


def choose(
    scorer: str,
    loads: Sequence[EndpointLoad],
    req: ScoreRequest,
    *,
    weights: dict[str, float] | None = None,
    rr: int = 0,
) -> tuple[int, str]:
    """Index into `loads` of the endpoint to use, and a short reason for the request log."""
    if not loads:
        raise ValueError("no candidates")
    if len(loads) == 1:
        if scorer == Scorer.SLO_COST and (req.shed_unmet or req.fallback_unmet):
            slo_cost(loads, req, rr)  # a lone engine that cannot meet the class sheds or moves it
        return 0, "only_endpoint"
    simple: dict[str, Callable[[Sequence[EndpointLoad], int], tuple[int, str]]] = {
        Scorer.ROUND_ROBIN: round_robin,
        Scorer.RANDOM: pick_random,
        Scorer.LEAST_OUTSTANDING: pick_least_outstanding,
    }
    if scorer in simple:
        return simple[scorer](loads, rr)
    if scorer == Scorer.BEST_FIT:
        return best_fit(loads, req, rr)
    if scorer == Scorer.PREFIX_AFFINITY:
        return affinity(loads, req.prefix_key, "prefix_affinity", rr)
    if scorer == Scorer.SESSION_AFFINITY:
        key = hashlib.blake2b(req.session_key.encode(), digest_size=16).digest() if req.session_key else None
        return affinity(loads, key, "session_affinity", rr)
    if scorer == Scorer.WEIGHTED:
        return weighted(loads, req, weights or {}, rr)
    if scorer == Scorer.PREDICTED_LATENCY:
        return predicted_latency(loads, req, rr)
    if scorer == Scorer.SLO_COST:
        return slo_cost(loads, req, rr)
    raise ValueError(f"unknown scorer {scorer!r}")
