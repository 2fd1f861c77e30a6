"""Step 10, account (always runs, whatever happened before): the limiter's reservation reconciled
(unused tokens refunded, the lease released), Prometheus metrics, the shadow mirror, and one
request-log row appended to the writer's batch."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from routing.proxy import metrics as m
from routing.proxy.pipeline import stages
from routing.proxy.pipeline.context import RequestContext
from routing.proxy.services import Services
from routing.proxy.shadow import MirrorJob

STATUS_CLASSES = {1: "1xx", 2: "2xx", 3: "3xx", 4: "4xx", 5: "5xx"}
ACCOUNT_CHILDREN_MAX = 10_000


class Children:
    """The metric children one kind of request counts into (alias, endpoint, status, tenant, pool,
    prompt length, version, arm), looked up once per kind instead of a dozen lookups per request."""

    __slots__ = (
        "latency",
        "pool_latency",
        "pool_requests",
        "requests",
        "tenant_completion",
        "tenant_latency",
        "tenant_prompt",
        "tenant_requests",
        "tokens_completion",
        "tokens_prompt",
        "ttft",
        "version_latency",
        "version_requests",
        "version_ttft",
    )

    def __init__(
        self, svc: Services, ctx: RequestContext, tenant: str, code: str, length: str, version: str
    ) -> None:
        metric = svc.metric
        alias, status, pool, arm = ctx.alias, ctx.status, ctx.pool, ctx.arm
        ep = ctx.endpoint
        dep = ep.id if ep else ""
        self.requests = metric(m.REQUESTS, alias, dep, status)
        self.tenant_requests = metric(m.TENANT_REQUESTS, tenant, code)
        self.tenant_latency = metric(m.TENANT_LATENCY, tenant)
        self.pool_requests: Any = metric(m.POOL_REQUESTS, pool, length, code) if pool else None
        self.pool_latency: Any = metric(m.POOL_LATENCY, pool, length) if pool else None
        if ep is not None:
            self.latency = metric(m.LATENCY, alias, dep)
            self.tokens_prompt = metric(m.TOKENS, alias, "prompt")
            self.tokens_completion = metric(m.TOKENS, alias, "completion")
            self.tenant_prompt = metric(m.TENANT_TOKENS, tenant, "prompt")
            self.tenant_completion = metric(m.TENANT_TOKENS, tenant, "completion")
            self.version_requests = metric(m.VERSION_REQUESTS, alias, version, arm, code)
            self.version_latency = metric(m.VERSION_LATENCY, alias, version, arm)
        # Made on a first time to first token only: a series appears once it has something to say.
        self.ttft: Any = None
        self.version_ttft: Any = None


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
    code = STATUS_CLASSES.get(ctx.status // 100, "other")
    tenant = ctx.key.tenant_name if ctx.key else ""
    length = "long" if prompt >= svc.long_prompt_tokens else "short"
    ep = ctx.endpoint
    if ep is None:
        dep = version = ""
    else:
        dep, version_id = ep.id, ep.version_id
        version = (
            "static" if version_id is None else svc.snapshot.version_labels.get(version_id) or str(version_id)
        )
    kind = (ctx.alias, dep, ctx.status, tenant, ctx.pool, length, ctx.arm, version)
    kids = svc.account_children.get(kind)
    if kids is None:
        if len(svc.account_children) >= ACCOUNT_CHILDREN_MAX:
            svc.account_children.clear()  # bounded: aliases in labels come from requests
        kids = svc.account_children[kind] = Children(svc, ctx, tenant, code, length, version)
    kids.requests.inc()
    kids.tenant_requests.inc()
    kids.tenant_latency.observe(latency)
    if kids.pool_requests is not None:
        kids.pool_requests.inc()
        kids.pool_latency.observe(latency)
    if ep is not None:
        ttft = ctx.ttft_s
        kids.latency.observe(latency)
        kids.tokens_prompt.inc(prompt)
        kids.tokens_completion.inc(completion)
        kids.tenant_prompt.inc(prompt)
        kids.tenant_completion.inc(completion)
        kids.version_requests.inc()
        kids.version_latency.observe(latency)
        if ttft is not None:
            if kids.ttft is None:
                kids.ttft = svc.metric(m.TTFT, ctx.alias, dep)
                kids.version_ttft = svc.metric(m.VERSION_TTFT, ctx.alias, version, ctx.arm)
            kids.ttft.observe(ttft)
            kids.version_ttft.observe(ttft)
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
