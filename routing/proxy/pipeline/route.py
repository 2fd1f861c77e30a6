"""Step 5, pick pool: the policy's rule (or its default, or the alias's pool) -> the pool, why, and the
endpoints the scorer may pick from: the canary candidate's when the request is drawn for it, the
fallback pool's when the pool has none that can take it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from routing.choices import Scorer
from routing.proxy import metrics as m
from routing.proxy import pin, spill
from routing.proxy.canary import draw
from routing.proxy.config import Canary, Endpoint, Policy, Pool
from routing.proxy.errors import ProxyError, bad_request, unavailable
from routing.proxy.pipeline.context import RequestContext, Scope, header
from routing.proxy.scorers import EndpointLoad
from routing.proxy.services import Services
from routing.proxy.wake import hold_until_awake

DEFAULT_OUTPUT_RESERVE = 1024


def context_length_error(
    max_model_len: int, tokens: int, out: int | None, out_field: str, token_prompt: bool
) -> ProxyError | None:
    """vLLM's refusal (message, status, param) when prompt + output does not fit, else None.

    vLLM checks the output cap first, then the prompt against `max_model_len - max_tokens`; it truncates
    text prompts one token past that and so reports "at least" that many (token-id prompts exactly).
    With no output cap, a prompt that fills the context leaves no room for one token.
    """
    if out is not None and out > max_model_len:
        return bad_request(
            f"{out_field}={out} cannot be greater than max_model_len=max_total_tokens={max_model_len}. "
            f"Please request fewer output tokens. (parameter={out_field}, value={out})",
            param=out_field,
            code="context_length_exceeded",
        )
    max_out = out or 0
    max_in = max_model_len - max_out
    if tokens > max_in:
        count = tokens if token_prompt else max_in + 1
        at_least = "" if token_prompt else "at least "
        return bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{max_out} output tokens and your prompt contains {at_least}{count} input tokens, for a total "
            f"of {at_least}{count + max_out} tokens. Please reduce the length of the input prompt or the "
            f"number of requested output tokens. (parameter=input_tokens, value={count})",
            param="input_tokens",
            code="context_length_exceeded",
        )
    if out is None and tokens >= max_model_len:
        return bad_request(
            f"The decoder prompt (length {tokens}) plus the number of requested output tokens (at least 1) "
            f"is longer than the maximum model length of {max_model_len}. Make sure that `max_model_len` "
            "is no smaller than the number of text tokens (prompt + requested output tokens).",
            code="context_length_exceeded",
        )
    return None


def rule_matches(rule: Any, alias: str, tokens: int, task: str | None, tenant: str, priority: str) -> bool:
    if rule.aliases is not None and alias not in rule.aliases:
        return False
    if rule.min_prompt_tokens is not None and tokens < rule.min_prompt_tokens:
        return False
    if rule.max_prompt_tokens is not None and tokens > rule.max_prompt_tokens:
        return False
    if rule.tasks is not None and task not in rule.tasks:
        return False
    if rule.tenants is not None and tenant not in rule.tenants:
        return False
    return rule.priority is None or rule.priority == priority


def pick_pool(
    svc: Services, policy: Policy | None, alias: str, ctx: RequestContext, task: str | None
) -> tuple[Pool, str]:
    pools = svc.snapshot.pools
    assert ctx.key is not None
    chain = ctx.chain
    if chain is not None:
        branch = ctx.stage_run.pool if ctx.stage_run is not None else None
        if branch is not None and branch in pools:
            return pools[branch], "chain branch"
        if chain.pool is not None and chain.pool in pools:
            return pools[chain.pool], "chain generate step"
    if policy is not None:
        for n, rule in enumerate(policy.rules, 1):  # numbered from 1, as the Routing page lists them
            if rule.pool in pools and rule_matches(
                rule, alias, ctx.prompt_tokens, task, ctx.key.tenant_name, ctx.priority
            ):
                return pools[rule.pool], f"policy {policy.name} rule {n}"
        if policy.default_pool and policy.default_pool in pools:
            return pools[policy.default_pool], f"policy {policy.name} default"
    pool = pools.get(alias)
    if pool is None:
        return Pool(name=alias, alias=alias), "no pool"
    return pool, "alias pool"


def route(
    svc: Services,
    ctx: RequestContext,
    scope: Scope,
    policy: Policy | None,
    alias: str,
    tokens: int,
    out: int | None,
) -> tuple[Pool, str, list[Endpoint]]:
    """The proxy's part of the route decision: the pool, why, and the endpoints the scorer picks from
    (the canary candidate's when the request is drawn for it and one can take it)."""
    pool, reason = pick_pool(svc, policy, alias, ctx, header(scope, b"x-task"))
    version = pin.requested_version(scope)
    if version is not None:
        return pinned_route(svc, pool, reason, alias, version, tokens, out)
    if pool.canary is not None:
        drawn = draw_canary(svc, ctx, pool, pool.canary, scope, tokens, out)
        if drawn:
            return pool, f"{reason}; canary {pool.canary.share:g}%", drawn
    candidates, fallback_used = candidates_of(svc, pool, policy, tokens, out)
    if fallback_used is not None:
        return fallback_used, f"{reason}; fallback {fallback_used.name}", candidates
    if policy is not None and pool.name in policy.spills:
        spilled = spill_to(svc, policy.spills[pool.name], candidates, tokens, out)
        if spilled is not None:
            return spilled[0], f"{reason}; {spilled[2]}", spilled[1]
    return pool, reason, candidates


def pinned_route(
    svc: Services, picked: Pool, reason: str, alias: str, version: int, tokens: int, out: int | None
) -> tuple[Pool, str, list[Endpoint]]:
    """The route of a request that names its version (routing/proxy/pin.py): that version's endpoints."""
    snap = svc.snapshot
    eps = takers(svc, pin.version_endpoints(snap, alias, version), tokens, out)
    label = snap.version_labels.get(version, "version")
    if not eps:
        raise pin.no_candidate(alias, version, label)
    pool = pin.pool_for(snap, picked, alias, version)
    return pool, f"{reason}; pinned version {label} (id {version})", eps


def takers(svc: Services, endpoints: Sequence[Endpoint], tokens: int, out: int | None) -> list[Endpoint]:
    """Those of `endpoints` that can take this request now: it fits their context (`fits`) and their
    live state says they are available (not ejected, not stale)."""
    now, state = time.monotonic(), svc.live.of
    return [ep for ep in endpoints if fits(ep, tokens, out) and state(ep).available(now)]


def fits(ep: Endpoint, tokens: int, out: int | None) -> bool:
    # As vLLM checks: the prompt plus the requested output (at least one token) within max_model_len.
    return ep.max_model_len is None or tokens + (1 if out is None else out) <= ep.max_model_len


def spill_to(
    svc: Services, rule: spill.Spill, home: list[Endpoint], tokens: int, out: int | None
) -> tuple[Pool, list[Endpoint], str] | None:
    """The spill pool, its endpoints with headroom and why, when this request spills (spill.decide);
    else None. `home` is the candidates of the rule's own pool; the request's KV need is its prompt
    plus its output budget."""
    pool = svc.snapshot.pools.get(rule.pool)
    if pool is None or not home:
        return None
    wall, state = time.time(), svc.live.of
    eps = takers(svc, pool.endpoints, tokens, out)
    if not eps:
        return None

    def load(ep: Endpoint) -> EndpointLoad:
        st = state(ep)
        return EndpointLoad(
            endpoint_id=ep.id,
            inflight=st.inflight,
            kv_free_tokens=st.kv_free_now(wall),
            kv_total_tokens=st.kv_total_tokens,
            max_inflight=pool.max_inflight_per_endpoint,
        )

    decision = spill.decide(rule, [load(ep) for ep in home], [load(ep) for ep in eps], tokens + (out or 0))
    if decision is None:
        return None
    chosen, why = decision
    return pool, [eps[i] for i in chosen], why


def candidates_of(
    svc: Services, pool: Pool, policy: Policy | None, tokens: int, out: int | None
) -> tuple[list[Endpoint], Pool | None]:
    eps = takers(svc, pool.endpoints, tokens, out)
    if eps or policy is None or not policy.fallback_pool:
        return eps, None
    fallback = svc.snapshot.pools.get(policy.fallback_pool)
    if fallback is None:
        return eps, None
    return takers(svc, fallback.endpoints, tokens, out), fallback


def slo_fallback_pool(svc: Services, policy: Policy | None, pool: Pool) -> Pool | None:
    """The policy's fallback pool when it is not `pool` itself: where slo_cost sends a request that no
    engine of `pool` is predicted to meet."""
    if policy is None or not policy.fallback_pool or policy.fallback_pool == pool.name:
        return None
    return svc.snapshot.pools.get(policy.fallback_pool)


def draw_canary(
    svc: Services, ctx: RequestContext, pool: Pool, canary: Canary, scope: Scope, tokens: int, out: int | None
) -> list[Endpoint] | None:
    """The candidate's endpoints when this request is drawn for the canary and one can take it;
    None sends it to the pool's own endpoints (a canary never fails a request for want of one)."""
    assert ctx.key is not None
    session = header(scope, canary.session_header) if canary.sticky_by == "session" else None
    if not draw(canary, session, ctx.key.tenant_id):
        svc.metric(m.CANARY_DRAWS, pool.alias, "baseline").inc()
        return None
    eps = takers(svc, canary.endpoints, tokens, out)
    if not eps:
        svc.metric(m.CANARY_DRAWS, pool.alias, "candidate_unavailable").inc()
        return None
    svc.metric(m.CANARY_DRAWS, pool.alias, "candidate").inc()
    ctx.arm = "canary"
    return eps


def raise_no_endpoint(
    svc: Services, pool: Pool, tokens: int, out: int | None, out_field: str, token_prompt: bool
) -> None:
    # Sleeping endpoints count too: a request none of them could take is told why, not held.
    members = pool.endpoints or pool.sleeping
    if not members and pool.version_id is not None:
        raise_if_version_not_ready(svc, pool)
    lens = [ep.max_model_len for ep in members if ep.max_model_len is not None]
    if members and lens and len(lens) == len(members):
        context_error = context_length_error(max(lens), tokens, out, out_field, token_prompt)
        if context_error is not None:
            raise context_error
    raise unavailable(
        f"No healthy endpoint serves '{pool.alias}' right now; retry shortly.", code="no_healthy_endpoint"
    )


def raise_if_version_not_ready(svc: Services, pool: Pool) -> None:
    """503 naming the version when no ready deployment anywhere runs the version the pool serves.

    Deployments of the alias's other versions never stand in for it: the client is told which
    version is meant, which ones are ready, and what an operator can do.
    """
    snap = svc.snapshot
    version = pool.version_id
    mine = [ep for ep in snap.endpoints.values() if ep.served_model_name == pool.alias]
    if any(ep.version_id == version for ep in mine):
        return  # some pool does have it: the usual "no healthy endpoint" answer applies
    label = f"{pool.version_label or 'version'} (id {version})"
    others = sorted(
        {
            f"{snap.version_labels.get(v, 'version')} (id {v})"
            for ep in mine
            if (v := ep.version_id) is not None
        }
    )
    ready = (
        f" Ready deployments of other versions ({', '.join(others)}) do not take its traffic."
        if others
        else ""
    )
    if pool.pinned:
        what = f"The pool '{pool.name}' serves the model '{pool.alias}' with version {label}"
        remedy = "or set the pool's model_version to a version that has one (or clear it)."
    else:
        what = f"The model '{pool.alias}' is served by its active version {label}"
        remedy = f"or switch the alias '{pool.alias}' to a version that has a ready deployment."
    raise ProxyError(
        503,
        f"{what}, which has no ready deployment.{ready} Deploy {label} (or wait for its deployment "
        f"to become ready), {remedy}",
        type="service_unavailable_error",
        param="model",
        code="model_version_not_ready",
    )


def default_out(candidates: Sequence[Endpoint], tokens: int) -> int:
    lens = [ep.max_model_len for ep in candidates if ep.max_model_len]
    if lens:
        return max(1, min(DEFAULT_OUTPUT_RESERVE, max(lens) - tokens))
    return DEFAULT_OUTPUT_RESERVE


def step(ctx: RequestContext, svc: Services) -> bool:
    """Pick the pool and its candidates. False: only sleeping engines could take the request, so
    `hold` must wait for one to wake (awake endpoints always come first)."""
    assert ctx.scope is not None and ctx.counted is not None
    t0 = time.perf_counter()
    alias = ctx.alias
    tokens = ctx.counted.tokens
    policy = svc.snapshot.policies.get(alias)
    # Embeddings generate nothing: the whole context is the input.
    out = 0 if ctx.kind == "embedding" else ctx.requested_out
    pool, reason, candidates = route(svc, ctx, ctx.scope, policy, alias, tokens, out)
    ctx.route_time = time.perf_counter() - t0
    ctx.pool = pool.name
    if not candidates:
        if any(fits(ep, tokens, out) for ep in pool.sleeping):
            ctx.policy, ctx.pool_obj = policy, pool
            return False
        raise_no_endpoint(svc, pool, tokens, out, ctx.max_out_field, ctx.token_prompt)
    settle(ctx, svc, policy, pool, reason, candidates, tokens, out)
    return True


async def hold(ctx: RequestContext, svc: Services) -> None:
    """Wake one of the pool's sleepers and hold the request until the route finds a candidate
    (routing/proxy/wake.py); 503 `engine_waking` with Retry-After at the pool's wake timeout."""
    assert ctx.scope is not None and ctx.counted is not None and ctx.pool_obj is not None
    scope, policy, alias, tokens = ctx.scope, ctx.policy, ctx.alias, ctx.counted.tokens
    out = 0 if ctx.kind == "embedding" else ctx.requested_out
    pool, reason, candidates = await hold_until_awake(
        svc.redis, ctx.pool_obj, lambda: route(svc, ctx, scope, policy, alias, tokens, out)
    )
    ctx.pool = pool.name
    settle(ctx, svc, policy, pool, reason, candidates, tokens, out)


def settle(
    ctx: RequestContext,
    svc: Services,
    policy: Policy | None,
    pool: Pool,
    reason: str,
    candidates: list[Endpoint],
    tokens: int,
    out: int | None,
) -> None:
    ctx.policy, ctx.pool_obj, ctx.candidates, ctx.reason = policy, pool, candidates, reason
    if ctx.arm == "canary":

        def baseline() -> list[Endpoint]:
            return candidates_of(svc, pool, policy, tokens, out)[0]

        ctx.baseline = baseline
    spare = slo_fallback_pool(svc, policy, pool) if pool.scorer == Scorer.SLO_COST else None
    if spare is not None:

        def move() -> tuple[Pool, list[Endpoint]] | None:
            eps = takers(svc, spare.endpoints, tokens, out)
            return (spare, eps) if eps else None

        ctx.slo_fallback = move
