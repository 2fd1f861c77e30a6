"""Step 7, pick endpoint and call: the scorer picks one of the candidates, the pooled keep-alive client
sends the request, and a failure before the first byte reaches the client is retried on another
endpoint. The answer itself is relayed by routing/proxy/pipeline/relay.py."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

import orjson

from routing.choices import Scorer, SloClass
from routing.proxy import dialect
from routing.proxy import metrics as m
from routing.proxy.config import Endpoint, Pool
from routing.proxy.errors import ProxyError, unavailable
from routing.proxy.pipeline import hold, relay
from routing.proxy.pipeline.context import (
    DisconnectWatch,
    RequestContext,
    RetryableUpstreamError,
    Send,
    client_gone_error,
    header,
)
from routing.proxy.scorers import (
    EndpointLoad,
    ScoreRequest,
    SloUnmet,
    choose,
    prefix_key,
    token_prefix_key,
)
from routing.proxy.services import Services
from routing.proxy.upstream import UpstreamResponse

log = logging.getLogger("routing.proxy.app")

PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions", "embedding": "/v1/embeddings"}
PREDICTED = (Scorer.PREDICTED_LATENCY, Scorer.SLO_COST)
# The scorers given the prompt's prefix key (the predicted ones guess prefix-cache hits with it).
KEYED = (Scorer.PREFIX_AFFINITY, Scorer.WEIGHTED, *PREDICTED)


def prepare(ctx: RequestContext, svc: Services) -> None:
    """The shadow draw, the body the engine gets, and what the scorer is told about the request."""
    info, body, pool, counted, scope = ctx.key, ctx.body, ctx.pool_obj, ctx.counted, ctx.scope
    assert info is not None and pool is not None and counted is not None and scope is not None
    assert body is not None
    shadow = svc.snapshot.shadows.get(ctx.alias)
    if (
        shadow is not None
        and info.shadow_consent
        and ctx.kind != "embedding"
        and body.get("n") in (None, 1)
        and random.random() * 100.0 < shadow.percent
    ):
        ctx.shadow = shadow
        ctx.shadow_body = body
    ctx.collect_text = info.log_prompts or ctx.shadow is not None
    upstream = dict(body)
    if ctx.stream:
        upstream["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    ctx.upstream_body = upstream
    ctx.client_wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    ctx.score_req = ScoreRequest(
        tokens_needed=ctx.reserve,
        prefix_key=(
            token_prefix_key(counted.leading_ids)
            if counted.leading_ids is not None
            else prefix_key("".join(ctx.parts))
        )
        if pool.scorer in KEYED
        else None,
        session_key=header(scope, pool.session_header.encode())
        if pool.scorer == Scorer.SESSION_AFFINITY
        else None,
        prompt_tokens=ctx.prompt_tokens,
    )
    if pool.scorer in PREDICTED:
        req = ctx.score_req
        req.output_tokens = svc.predictors.output_tokens(info.tenant_id, ctx.alias, ctx.requested_out)
        targets = svc.slo_targets.get(info.slo_class)
        if targets is not None:
            req.ttft_target_s, req.tpot_target_s = targets
        req.shed_unmet = info.slo_class == SloClass.BATCH
        req.fallback_unmet = not req.shed_unmet and ctx.slo_fallback is not None


async def step(ctx: RequestContext, svc: Services) -> None:
    prepare(ctx, svc)
    assert ctx.pool_obj is not None and ctx.score_req is not None and ctx.send is not None
    assert ctx.upstream_body is not None
    watch = DisconnectWatch(ctx)
    try:
        await try_endpoints(
            svc,
            ctx,
            ctx.pool_obj,
            ctx.candidates,
            ctx.score_req,
            ctx.upstream_body,
            ctx.reason,
            ctx.route_time,
            ctx.send,
            ctx.baseline,
        )
    finally:
        watch.cancel()


async def try_endpoints(
    svc: Services,
    ctx: RequestContext,
    pool: Pool,
    candidates: Sequence[Endpoint],
    score_req: ScoreRequest,
    upstream: dict[str, Any],
    reason: str,
    route_time: float,
    send: Send,
    baseline: Callable[[], list[Endpoint]] | None = None,
) -> None:
    """Send to one of `candidates`, retrying on another before the first byte reaches the client.

    `baseline` (a canary request only): where to go when no candidate endpoint could even be
    reached. A candidate that answers badly (5xx, timeout) keeps the request: those answers are
    the canary's to own, and its gates must see them.
    """
    tried: set[str] = set()
    last: RetryableUpstreamError | None = None
    unreachable_only = True
    wall = time.time()
    states = svc.live.states
    state_of = svc.live.of
    predictors = svc.predictors

    def loads_of(live: list[Endpoint], pool: Pool) -> list[EndpointLoad]:
        predicted = pool.scorer in PREDICTED
        return [
            EndpointLoad(
                endpoint_id=ep.id,
                inflight=states[ep.id].inflight,
                kv_free_tokens=states[ep.id].kv_free_now(wall),
                kv_total_tokens=states[ep.id].kv_total_tokens,
                max_inflight=pool.max_inflight_per_endpoint,
                model=predictors.model(ep.id) if predicted else None,
                cost_per_hour=ep.cost_per_hour,
            )
            for ep in live
        ]

    for attempt in range(pool.max_retries + 1):
        now = time.monotonic()
        live = [ep for ep in candidates if ep.id not in tried and state_of(ep).available(now)]
        if not live and baseline is not None and last is not None and unreachable_only:
            candidates, baseline = baseline(), None
            ctx.arm = "primary"
            reason += "; canary candidate unreachable, baseline"
            svc.metric(m.CANARY_DRAWS, pool.alias, "candidate_unreachable").inc()
            live = [ep for ep in candidates if ep.id not in tried and state_of(ep).available(now)]
        if not live:
            break
        t0 = time.perf_counter()
        loads = loads_of(live, pool)
        rr = svc.live.rr.get(pool.name, 0)
        svc.live.rr[pool.name] = rr + 1
        try:
            index, why = choose(pool.scorer, loads, score_req, weights=pool.weights, rr=rr)
        except SloUnmet:
            if score_req.shed_unmet:
                svc.metric(m.SLO_REQUESTS, pool.name, SloClass.BATCH, "shed").inc()
                raise ProxyError(
                    429,
                    "No engine is predicted to meet this key's batch latency class right now; retry later.",
                    type="rate_limit_error",
                    code="slo_shed",
                ) from None
            # No engine here is predicted to meet the class: the policy's fallback pool takes it, or,
            # when that has no engine that can, the soonest engine here does (asked once per request).
            score_req.fallback_unmet = False
            moved = ctx.slo_fallback() if ctx.slo_fallback is not None else None
            if moved is not None:
                assert ctx.key is not None
                svc.metric(m.SLO_REQUESTS, pool.name, ctx.key.slo_class, "fallback").inc()
                reason += f"; slo_cost none_meet in {pool.name}, fallback {moved[0].name}"
                pool, candidates = moved
                ctx.pool, ctx.pool_obj = pool.name, pool
                live = [ep for ep in candidates if state_of(ep).available(now)]
                loads = loads_of(live, pool)
            index, why = choose(pool.scorer, loads, score_req, weights=pool.weights, rr=rr)
        ep = live[index]
        # What this engine kind is sent (a 400 for what it cannot do, before anything is counted).
        ctx.dialect = dialect.for_endpoint(ep.engine, upstream, ctx.kind, ctx.prompt_tokens)
        decision = route_time + time.perf_counter() - t0
        m.DECISION_SECONDS.observe(decision)
        dep_label = ep.id
        svc.metric(m.ROUTE_DECISIONS, pool.name, pool.scorer, dep_label).inc()
        ctx.endpoint = ep
        ctx.route_reason = f"{reason}; {why}" + (f"; retry {attempt}" if attempt else "")
        ctx.retries = attempt
        state = states[ep.id]
        state.begin(now, score_req.tokens_needed)
        inflight = svc.metric(m.INFLIGHT, dep_label)
        inflight.inc()
        # Every pool's engines are learnt (not only the predicted scorers'), so a pool switched to one
        # starts warm and the routing page shows every engine's predictions; other pools' engines from
        # one answered request in predict.LEARN_EVERY once warm (a fit update is most of the cost).
        load = loads[index]
        kv_total = load.kv_total_tokens
        learn = pool.scorer in PREDICTED or predictors.learns(ep.id)
        admission = predictors.dispatch(
            ep.id,
            ctx.prompt_tokens,
            1.0 - load.kv_free_tokens / kv_total if kv_total and load.kv_free_tokens is not None else 0.0,
            score_req.prefix_key,
            predict=learn,
        )
        ctx.on_first_token = partial(predictors.first_token, admission)
        called = time.perf_counter()
        try:
            upstream["model"] = ep.served_model_name
            if ctx.dialect is None:
                await attempt_call(svc, ctx, pool, ep, orjson.dumps(upstream), send)
            else:
                payloads = ctx.dialect.bodies(ep.served_model_name)
                if len(payloads) == 1 or ctx.stream:
                    await attempt_call(svc, ctx, pool, ep, payloads[0], send, payloads[1:])
                else:
                    await fan_out(svc, ctx, pool, ep, payloads, send)
            if ctx.status < 500:
                state.success()
            if ctx.status == 200:
                duration = time.perf_counter() - called
                predictors.observe(
                    admission,
                    ctx.ttft_s,
                    duration,
                    ctx.completion_tokens,
                    cached_tokens=ctx.usage_cached_tokens,
                    learn=learn,
                )
                if ctx.ttft_s is not None and ctx.key is not None:
                    count_slo(svc, pool.name, ctx.key.slo_class, ctx.ttft_s, duration, ctx.completion_tokens)
                if ctx.completion_tokens is not None and ctx.key is not None:
                    predictors.observe_output(
                        ctx.key.tenant_id, ctx.alias, ctx.requested_out, ctx.completion_tokens
                    )
            return
        except RetryableUpstreamError as exc:
            last = exc
            unreachable_only = unreachable_only and exc.unreachable
            tried.add(ep.id)
            if state.failure(time.monotonic()):
                m.EJECTIONS.labels(dep_label).inc()
                log.warning("proxy: ejected endpoint %s (%s)", ep.id, exc.reason)
            if attempt < pool.max_retries:
                m.RETRIES.labels(ctx.alias).inc()
        finally:
            state.end()
            inflight.dec()
            ctx.on_first_token = None
            predictors.release(admission)
    if last is not None and last.status == 504:
        raise ProxyError(
            504,
            f"The model server timed out ({last.reason}).",
            type="server_error",
            code="upstream_timeout",
        )
    if last is not None:
        raise ProxyError(
            502, f"The model server failed ({last.reason}).", type="server_error", code="upstream_error"
        )
    raise unavailable(
        f"No healthy endpoint serves '{pool.alias}' right now; retry shortly.", code="no_healthy_endpoint"
    )


def count_slo(
    svc: Services, pool: str, slo_class: str, ttft: float, duration: float, tokens: int | None
) -> None:
    """Whether an answered stream met its SLO class's targets (goodput per class, in the metrics)."""
    targets = svc.slo_targets.get(slo_class)
    if targets is None:
        return
    tpot = (duration - ttft) / (tokens - 1) if tokens is not None and tokens > 1 else 0.0
    met = ttft <= targets[0] and tpot <= targets[1]
    svc.metric(m.SLO_REQUESTS, pool, slo_class, "met" if met else "missed").inc()


def engine_address(svc: Services, ep: Endpoint) -> tuple[str, int, bytes]:
    """Where an engine call goes: host, port, and the header line with the engine's key (if it has one)."""
    host, port = svc.hostport(ep.base_url)
    extra = b"Authorization: Bearer " + ep.api_key.encode() + b"\r\n" if ep.api_key else b""
    return host, port, extra


async def attempt_call(
    svc: Services,
    ctx: RequestContext,
    pool: Pool,
    ep: Endpoint,
    payload: bytes,
    send: Send,
    then: Sequence[bytes] = (),
) -> None:
    """One call to `ep`; RetryableUpstreamError while nothing has reached the client yet. `then`: the
    bodies of a fanned-out stream's later choices, each called when the one before has ended."""
    path = PATHS[ctx.kind]
    host, port, extra = engine_address(svc, ep)
    started = time.perf_counter()
    deadline = started + pool.total_timeout_s
    # Non-streaming answers arrive whole, so for them only the total timeout applies.
    header_budget = pool.first_byte_timeout_s if ctx.stream else pool.total_timeout_s
    ctx.deadline(started + header_budget)
    try:
        resp = await svc.upstream.post(
            host, port, path, payload, extra, pool.connect_timeout_s, ctx.track_upstream
        )
    except TimeoutError:
        ctx.clear_deadline()
        raise RetryableUpstreamError("no response before the first-byte timeout", 504) from None
    except OSError as exc:
        ctx.clear_deadline()
        if ctx.client_gone:
            raise client_gone_error() from None
        raise RetryableUpstreamError(f"connect failed: {type(exc).__name__}", unreachable=True) from None
    if then and resp.status == 200:
        resp = ChainedResponse(
            resp,
            lambda body: svc.upstream.post(
                host, port, path, body, extra, pool.connect_timeout_s, ctx.track_upstream
            ),
            then,
        )
    try:
        if resp.status >= 500:
            if ctx.dialect is None or not await relay.engine_refused(svc, ctx, resp, path, deadline, send):
                raise RetryableUpstreamError(f"HTTP {resp.status}")
            return
        if not ctx.stream or resp.status != 200:
            await relay.whole(svc, ctx, resp, path, deadline, send)
            return
        if ctx.chain is not None and ctx.chain.holds:
            await hold.stream(svc, ctx, pool, resp, started, deadline, send)
            return
        await relay.stream(svc, ctx, pool, resp, started, deadline, send)
    finally:
        ctx.clear_deadline()
        # Forget it before it goes back to the pool: a later hang-up must not close a connection
        # that another request may be using by then.
        ctx.upstream = None
        resp.release()


async def fan_out(
    svc: Services, ctx: RequestContext, pool: Pool, ep: Endpoint, payloads: list[bytes], send: Send
) -> None:
    """`n` choices from an engine that makes one per request: one call per choice, all at once, and one
    answer made of them (routing/proxy/dialect.py). Not streamed; any failure fails them all."""
    assert ctx.dialect is not None
    path = PATHS[ctx.kind]
    host, port, extra = engine_address(svc, ep)

    async def one(payload: bytes) -> tuple[int, bytes]:
        resp = await svc.upstream.post(host, port, path, payload, extra, pool.connect_timeout_s)
        try:
            return resp.status, await resp.read()
        finally:
            resp.release()  # a call cut short closes its connection (not complete: not pooled)

    # The calls are not the one ctx.deadline and the DisconnectWatch act on (ctx.upstream): the total
    # timeout is their own, and cancels every call when it passes. A client that leaves is noticed once
    # the answers are in, so the engine finishes the n choices (bounded by that timeout).
    try:
        async with asyncio.timeout(pool.total_timeout_s):
            answers = await asyncio.gather(*(one(p) for p in payloads))
    except TimeoutError:
        raise RetryableUpstreamError("no answer before the total timeout", 504) from None
    except OSError as exc:
        if ctx.client_gone:
            raise client_gone_error() from None
        raise RetryableUpstreamError(f"connect failed: {type(exc).__name__}", unreachable=True) from None
    for status, data in answers:
        if status != 200:
            status, data = ctx.dialect.error(status, data)
            if status >= 500:
                raise RetryableUpstreamError(f"HTTP {status}")
            await relay.answer(svc, ctx, status, data, path, send)
            return
    await relay.answer(svc, ctx, 200, ctx.dialect.whole([data for _, data in answers]), path, send)


class ChainedResponse(UpstreamResponse):
    """The streams of a fanned-out request read as one: when one ends, the next choice's call is made and
    read. The engine's dialect numbers each stream's choice and keeps one end of stream (dialect.py).
    An engine that takes one request at a time would run the calls one after another anyway."""

    def __init__(
        self,
        first: UpstreamResponse,
        call: Callable[[bytes], Awaitable[UpstreamResponse]],
        then: Sequence[bytes],
    ) -> None:  # a view over other responses: none of the parser state of its own
        self.current = first
        self.call = call
        self.then = list(then)
        self.status = first.status
        self.complete = False

    def read_nowait(self) -> bytes | None:
        chunk = self.current.read_nowait()
        return None if chunk == b"" and self.then else chunk

    async def readany(self) -> bytes:
        chunk = await self.current.readany()
        while not chunk and self.then:
            self.current.release()
            self.current = await self.call(self.then.pop(0))
            if self.current.status != 200:
                raise OSError(f"the engine answered HTTP {self.current.status} for a later choice")
            chunk = await self.current.readany()
        self.complete = not self.then and self.current.complete
        return chunk

    def release(self) -> None:
        self.current.release()
