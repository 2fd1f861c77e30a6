"""Step 6, admit: batch traffic shed when its pool is full, then the tenant's limits (one Lua call:
RPM, TPM reservation, concurrency lease, budget) for the prompt plus the output it may produce."""

from __future__ import annotations

from routing.choices import Priority
from routing.proxy.errors import rate_limited
from routing.proxy.pipeline.context import RequestContext
from routing.proxy.pipeline.route import default_out
from routing.proxy.services import Services


async def step(ctx: RequestContext, svc: Services) -> None:
    pool, candidates, counted, info = ctx.pool_obj, ctx.candidates, ctx.counted, ctx.key
    assert pool is not None and counted is not None and info is not None
    # Interactive first: batch may fill only `batch_max_fraction` of the pool's capacity, and the
    # headroom above that is left to interactive requests, which the proxy never sheds.
    if ctx.priority == Priority.BATCH:
        states = svc.live.states
        if sum(states[ep.id].inflight for ep in candidates) >= (
            pool.batch_max_fraction * pool.max_inflight_per_endpoint * len(candidates)
        ):
            raise rate_limited(
                f"Pool '{pool.name}' is saturated for batch traffic; batch requests are shed until it "
                "has room.",
                code="pool_saturated",
                headers=[(b"retry-after", b"1")],
            )
    if ctx.kind == "embedding":
        reserve = counted.tokens
    else:
        reserve = counted.tokens + (ctx.requested_out or default_out(candidates, counted.tokens))
    ctx.reserve = reserve
    assert svc.limiter is not None
    ctx.admission = await svc.limiter.admit(info, ctx.request_id, reserve)
    if ctx.admission is not None and ctx.admission.lease_keys:
        svc.leases.held[ctx.request_id] = ctx.admission.lease_keys
