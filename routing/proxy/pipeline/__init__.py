"""The request pipeline of the `/v1/` inference endpoints: named steps, one module each, one
RequestContext carried through, the long-lived services (routing/proxy/services.py) handed in.

    authenticate -> read (and validate) -> count -> pre-stages -> route (pick pool) -> admit (limits)
    -> call (pick endpoint, call; relay streams or passes the answer) -> post-stages -> account

A cache hit found by a pre-stage is answered by `replay` in place of route, admit and call.

`account` runs whatever happened before it (an error is answered first, in the OpenAI shape).
"""

from __future__ import annotations

import contextlib
import logging
import time

from routing.proxy import metrics as m
from routing.proxy.errors import ProxyError
from routing.proxy.pipeline import account, admit, authenticate, call, count, read, replay, route, stages
from routing.proxy.pipeline.context import Receive, RequestContext, Scope, Send
from routing.proxy.pipeline.respond import send_error
from routing.proxy.services import Services

log = logging.getLogger("routing.proxy.app")


async def run(ctx: RequestContext, svc: Services) -> None:
    """The steps up to the answer; each raises a ProxyError to stop the request with that answer."""
    scope = ctx.scope
    assert scope is not None
    ctx.key = await authenticate.authenticate(scope, svc.keys)
    await read.step(ctx, svc)
    tokenizer = count.tokenizer_to_load(ctx, svc)
    if tokenizer is not None:
        await svc.tokenizers.get(tokenizer)
    count.step(ctx, svc)
    if svc.snapshot.chains:
        stages.select(ctx, svc)
    chain = ctx.chain
    if chain is not None and chain.pre:
        await stages.pre(ctx, svc)
        if stages.run_of(ctx).cached is not None:
            # A cache hit: the stored answer instead of route, admit and call.
            await replay.step(ctx, svc)
            if chain.respond:
                await stages.post(ctx, svc)
            return
    if not route.step(ctx, svc):
        await route.hold(ctx, svc)  # only sleeping engines could take it: wake one, then go on
    await admit.step(ctx, svc)
    await call.step(ctx, svc)
    if chain is not None and chain.respond:
        await stages.post(ctx, svc)


async def handle(svc: Services, scope: Scope, receive: Receive, send: Send, kind: str) -> RequestContext:
    """One inference request, answered (or refused) and accounted for."""
    ctx = RequestContext(request_id=svc.next_request_id(), kind=kind, started=time.perf_counter())
    ctx.scope, ctx.receive, ctx.send = scope, receive, send
    try:
        await run(ctx, svc)
    except ProxyError as err:
        ctx.status = err.status
        ctx.error_type = err.code or err.type
        if err.status == 429:
            m.LIMIT_REJECTIONS.labels(err.code or "rate_limit").inc()
        if err.status != 499:
            await send_error(send, err, ctx.request_id)
    except Exception:
        log.exception("proxy: unexpected error")
        ctx.status = 500
        ctx.error_type = "internal_error"
        with contextlib.suppress(Exception):
            await send_error(
                send,
                ProxyError(500, "The proxy failed unexpectedly.", type="server_error", code="internal_error"),
                ctx.request_id,
            )
    finally:
        await account.finish(ctx, svc)
    return ctx
