"""Step 10, account (always runs, whatever happened before): the limiter's reservation reconciled
(unused tokens refunded, the lease released), Prometheus metrics, the shadow mirror, and one
request-log row appended to the writer's batch."""

from __future__ import annotations

import datetime as dt
import time

from routing.proxy import metrics as m
from routing.proxy.pipeline import stages
from routing.proxy.pipeline.context import RequestContext
from routing.proxy.services import Services
from routing.proxy.shadow import MirrorJob

STATUS_CLASSES = {1: "1xx", 2: "2xx", 3: "3xx", 4: "4xx", 5: "5xx"}


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def mirror(svc: Services, ctx: RequestContext, latency: float) -> None:
    """Mirror an answered request to the shadow candidate (after the client has its answer)."""
    shadow = ctx.shadow
    assert shadow is not None and ctx.shadow_body is not None
    if ctx.status != 200 or ctx.error_type or ctx.endpoint is None:
        m.SHADOW_SKIPPED.labels(shadow.alias, "primary_failed").inc()
        return
    pool = svc.snapshot.pools.get(ctx.pool)
    per_endpoint = pool.max_inflight_per_endpoint if pool else 64
    fraction = pool.batch_max_fraction if pool else 0.8
    svc.shadow.submit(
        MirrorJob(
            shadow=shadow,
            request_id=ctx.request_id,
            kind=ctx.kind,
            tenant_id=ctx.key.tenant_id if ctx.key else None,
            body=ctx.shadow_body,
            primary_version_id=ctx.endpoint.version_id,
            primary_output="".join(ctx.response_parts),
            primary_latency_ms=latency * 1000,
            room_per_endpoint=fraction * per_endpoint,
            connect_timeout_s=pool.connect_timeout_s if pool else 2.0,
        )
    )


async def finish(ctx: RequestContext, svc: Services) -> None:
    latency = time.perf_counter() - ctx.started
    prompt = ctx.usage_prompt_tokens if ctx.usage_prompt_tokens is not None else ctx.prompt_tokens
    if ctx.stage_run is not None and ctx.stage_run.cached is not None:
        # A cache hit: no engine worked for it, so no tokens are billed, logged or counted.
        prompt, ctx.completion_tokens, ctx.usage_prompt_tokens = 0, 0, 0
    completion = ctx.completion_tokens or 0
    if ctx.admission is not None:
        svc.leases.held.pop(ctx.request_id, None)
        # A request the engine never answered used nothing: the whole reservation goes back.
        answered = 0 < ctx.status < 400 or ctx.completion_tokens is not None
        used = prompt + completion if answered else 0
        assert svc.limiter is not None
        await svc.limiter.finish(ctx.admission, used)
    metric = svc.metric
    dep = ctx.endpoint.id if ctx.endpoint else ""
    metric(m.REQUESTS, ctx.alias, dep, ctx.status).inc()
    code = STATUS_CLASSES.get(ctx.status // 100, "other")
    tenant = ctx.key.tenant_name if ctx.key else ""
    metric(m.TENANT_REQUESTS, tenant, code).inc()
    metric(m.TENANT_LATENCY, tenant).observe(latency)
    if ctx.pool:
        length = "long" if prompt >= svc.long_prompt_tokens else "short"
        metric(m.POOL_REQUESTS, ctx.pool, length, code).inc()
        metric(m.POOL_LATENCY, ctx.pool, length).observe(latency)
    if ctx.endpoint is not None:
        metric(m.LATENCY, ctx.alias, dep).observe(latency)
        if ctx.ttft_s is not None:
            metric(m.TTFT, ctx.alias, dep).observe(ctx.ttft_s)
        metric(m.TOKENS, ctx.alias, "prompt").inc(prompt)
        metric(m.TOKENS, ctx.alias, "completion").inc(completion)
        metric(m.TENANT_TOKENS, tenant, "prompt").inc(prompt)
        metric(m.TENANT_TOKENS, tenant, "completion").inc(completion)
        version_id = ctx.endpoint.version_id
        labels = svc.snapshot.version_labels
        version = "static" if version_id is None else labels.get(version_id) or str(version_id)
        metric(m.VERSION_REQUESTS, ctx.alias, version, ctx.arm, code).inc()
        metric(m.VERSION_LATENCY, ctx.alias, version, ctx.arm).observe(latency)
        if ctx.ttft_s is not None:
            metric(m.VERSION_TTFT, ctx.alias, version, ctx.arm).observe(ctx.ttft_s)
    if ctx.shadow is not None:
        mirror(svc, ctx, latency)
    per_stage = None
    if ctx.chain is not None:
        note = stages.account(ctx)
        ctx.route_reason = f"{note}; {ctx.route_reason}" if ctx.route_reason else note
        per_stage = stages.columns(ctx)
    if ctx.key is None or svc.reqlog is None:
        return  # unauthenticated noise is counted in metrics, not logged per row
    key = ctx.key
    svc.reqlog.add(
        {
            "created_at": utcnow(),
            "request_id": ctx.request_id,
            "key_id": key.id,
            "tenant_id": key.tenant_id,
            "tenant_name": key.tenant_name,
            "key_prefix": key.prefix,
            "endpoint_kind": ctx.kind,
            "alias": ctx.alias[:100],
            "deployment_id": ctx.endpoint.deployment_id if ctx.endpoint else None,
            "model_version_id": ctx.endpoint.version_id if ctx.endpoint else None,
            "upstream": ctx.endpoint.base_url if ctx.endpoint else "",
            "status": ctx.status,
            "error_type": ctx.error_type[:64],
            "stream": ctx.stream,
            "priority": ctx.priority,
            "prompt_tokens": prompt if ctx.alias else None,
            "prompt_tokens_estimated": ctx.prompt_estimated and ctx.usage_prompt_tokens is None,
            "completion_tokens": ctx.completion_tokens,
            "ttft_ms": ctx.ttft_s * 1000 if ctx.ttft_s is not None else None,
            "latency_ms": latency * 1000,
            "retries": ctx.retries,
            "route_pool": ctx.pool[:100],
            "route_reason": ctx.route_reason[:200],
            "prompt_text": ctx.prompt_text if key.log_prompts else None,
            "response_text": "".join(ctx.response_parts) if key.log_prompts else None,
            "stages": per_stage,
        }
    )
