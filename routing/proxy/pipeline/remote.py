"""One call to a CPU pool's engine for a chain stage (a remote stage, a model classifier).

The pool serves the OpenAI API (llama.cpp or vLLM on CPU), so a stage's work is a `/v1/chat/completions`
call with the stage's instruction as the system message. The endpoint is picked the way generation
picks one: the pool's available endpoints by its scorer, on this process's live state (in-flight
counts, circuit breakers), and a failure counts against the endpoint's breaker. One attempt, bounded
by the stage's own timeout (connect, send, answer, all in it): a stage that has to be fast cannot
spend its budget on retries, and its `on_failure` says what happens then.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson

from routing.proxy import metrics as m
from routing.proxy.scorers import EndpointLoad, ScoreRequest, choose
from routing.proxy.services import Services

PATH = "/v1/chat/completions"


class RemoteFailure(Exception):
    """The CPU engine could not do the stage's work; `why` is one short word for outcomes and metrics
    (timeout, unavailable, error), `detail` says more for the error message and the log."""

    def __init__(self, why: str, detail: str) -> None:
        super().__init__(f"{why}: {detail}")
        self.why = why
        self.detail = detail


async def chat(
    svc: Services,
    pool_name: str,
    messages: list[dict[str, Any]],
    *,
    max_tokens: int,
    timeout_s: float,
    temperature: float | None = None,
) -> str:
    """The text of the pool's engine's answer to `messages`; RemoteFailure when there is none in time."""
    pool = svc.snapshot.pools.get(pool_name)
    if pool is None:
        raise RemoteFailure("unavailable", f"no pool named '{pool_name}'")
    now = time.monotonic()
    state_of = svc.live.of
    live = [ep for ep in pool.endpoints if state_of(ep).available(now)]
    if not live:
        raise RemoteFailure("unavailable", f"no healthy endpoint in the pool '{pool_name}'")
    wall = time.time()
    loads = [
        EndpointLoad(
            endpoint_id=ep.id,
            inflight=state_of(ep).inflight,
            kv_free_tokens=state_of(ep).kv_free_now(wall),
            kv_total_tokens=state_of(ep).kv_total_tokens,
            max_inflight=pool.max_inflight_per_endpoint,
        )
        for ep in live
    ]
    rr = svc.live.rr.get(pool.name, 0)
    svc.live.rr[pool.name] = rr + 1
    index, _ = choose(pool.scorer, loads, ScoreRequest(), weights=pool.weights, rr=rr)
    ep = live[index]
    svc.metric(m.ROUTE_DECISIONS, pool.name, pool.scorer, ep.id).inc()
    body: dict[str, Any] = {"model": ep.served_model_name, "messages": messages, "max_tokens": max_tokens}
    if temperature is not None:
        body["temperature"] = temperature
    host, port = svc.hostport(ep.base_url)
    extra = b"Authorization: Bearer " + ep.api_key.encode() + b"\r\n" if ep.api_key else b""
    state = state_of(ep)
    state.begin(now, 0)
    try:
        # A timeout cancels the wait: the upstream client then closes the connection (the engine may
        # still answer on it), so a late answer never reaches a later request.
        async with asyncio.timeout(timeout_s):
            resp = await svc.upstream.post(
                host, port, PATH, orjson.dumps(body), extra, min(pool.connect_timeout_s, timeout_s)
            )
            try:
                data = await resp.read()
            finally:
                resp.release()
    except TimeoutError:
        state.failure(time.monotonic())
        raise RemoteFailure("timeout", f"no answer from {ep.id} within {timeout_s * 1000:g} ms") from None
    except OSError as exc:
        state.failure(time.monotonic())
        raise RemoteFailure("unavailable", f"{ep.id}: {type(exc).__name__}") from None
    finally:
        state.end()
    if resp.status != 200:
        if resp.status >= 500:
            state.failure(time.monotonic())
        raise RemoteFailure("error", f"{ep.id} answered HTTP {resp.status}")
    try:
        text = orjson.loads(data)["choices"][0]["message"]["content"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        raise RemoteFailure("error", f"{ep.id} answered no chat completion") from None
    if not isinstance(text, str):
        raise RemoteFailure("error", f"{ep.id} answered no text")
    state.success()
    return text
