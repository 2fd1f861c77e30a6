"""Step 7 for a cache hit, replay: the stored answer (routing/proxy/answercache.py) instead of route,
admit and call; whole or as an SSE stream as the client asked, whichever way it was stored, through the
chain's answer stages like an engine's answer.

A hit counts as one request against the tenant's requests-per-minute limit and holds a concurrency
lease while it is replayed (one limiter call reserving no tokens), so a client cannot use the cache to
go past its request rate; it reserves and uses no tokens (TPM, daily budget) and reaches no engine.
"""

from __future__ import annotations

import time

import orjson

from routing.proxy import answercache
from routing.proxy.errors import ProxyError
from routing.proxy.pipeline import relay
from routing.proxy.pipeline.context import RequestContext
from routing.proxy.pipeline.respond import JSON_HEADERS, SSE_HEADERS, response_headers, send_raw
from routing.proxy.services import Services


async def step(ctx: RequestContext, svc: Services) -> None:
    run, key, body, send, chain = ctx.stage_run, ctx.key, ctx.body, ctx.send, ctx.chain
    assert run is not None and run.cached is not None and key is not None and body is not None
    assert send is not None and chain is not None and svc.limiter is not None
    ctx.admission = await svc.limiter.admit(key, ctx.request_id, 0)
    if ctx.admission is not None and ctx.admission.lease_keys:
        svc.leases.held[ctx.request_id] = ctx.admission.lease_keys
    ctx.route_reason = "cache hit"
    ctx.collect_text = key.log_prompts
    ctx.status = 200
    if chain.holds:
        await _held(ctx, svc)
        return
    if not ctx.stream:
        data = orjson.dumps(answercache.replay_whole(run.cached, ctx.request_id, ctx.kind))
        if chain.answer:
            data = relay.staged_whole(ctx, data)  # a ProxyError here refuses it, as for an engine's
        relay.usage_from(ctx, data)
        await send_raw(send, 200, data, response_headers(ctx, JSON_HEADERS))
        return
    wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    events = answercache.replay_events(run.cached, ctx.request_id, ctx.kind, wants_usage)
    await send({"type": "http.response.start", "status": 200, "headers": response_headers(ctx, SSE_HEADERS)})
    ctx.ttft_s = time.perf_counter() - ctx.started
    for event in events:
        if chain.answer:
            try:
                out = relay.staged_events(ctx, event, wants_usage, ctx.collect_text)
            except ProxyError as err:
                # As for an engine's stream: end it with the stage's error.
                ctx.error_type = err.code or err.type
                await send(
                    {
                        "type": "http.response.body",
                        "body": b"data: " + err.body() + b"\n\ndata: [DONE]\n\n",
                        "more_body": True,
                    }
                )
                break
        else:
            out = relay.filter_events(ctx, event, wants_usage, ctx.collect_text)
        if out:
            await send({"type": "http.response.body", "body": out, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def _held(ctx: RequestContext, svc: Services) -> None:
    """A hit for a chain with a holding stage (a remote rewrite on a CPU engine): as for an engine's
    answer, every answer stage runs on the whole text first (a stage that fails closed refuses the
    request before anything is sent), then the rewritten answer goes out whole or as a stream."""
    run, body, send = ctx.stage_run, ctx.body, ctx.send
    assert run is not None and run.cached is not None and body is not None and send is not None
    whole = orjson.dumps(answercache.replay_whole(run.cached, ctx.request_id, ctx.kind))
    data = await relay.held_whole(svc, ctx, whole)
    relay.usage_from(ctx, data)
    if not ctx.stream:
        await send_raw(send, 200, data, response_headers(ctx, JSON_HEADERS))
        return
    wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    events = answercache.replay_events(orjson.loads(data), ctx.request_id, ctx.kind, wants_usage)
    await send({"type": "http.response.start", "status": 200, "headers": response_headers(ctx, SSE_HEADERS)})
    ctx.ttft_s = time.perf_counter() - ctx.started
    for event in events:
        out = relay.filter_events(ctx, event, wants_usage, False)
        if out:
            await send({"type": "http.response.body", "body": out, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
