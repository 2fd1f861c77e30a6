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
from collections.abc import AsyncGenerator
from typing import Any

import orjson

from routing.proxy import metrics as m
from routing.proxy.config import Endpoint, Pool
from routing.proxy.scorers import EndpointLoad, ScoreRequest, choose
from routing.proxy.services import Services
from routing.proxy.upstream import UpstreamResponse

PATH = "/v1/chat/completions"


class RemoteFailure(Exception):
    """The CPU engine could not do the stage's work; `why` is one short word for outcomes and metrics
    (timeout, unavailable, error), `detail` says more for the error message and the log."""

    def __init__(self, why: str, detail: str) -> None:
        super().__init__(f"{why}: {detail}")
        self.why = why
        self.detail = detail


def pick(svc: Services, pool_name: str) -> tuple[Pool, Endpoint]:
    """The pool and the endpoint its scorer picks among its available ones; RemoteFailure when none."""
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
    return pool, ep


async def _post(
    svc: Services, pool: Pool, ep: Endpoint, body: dict[str, Any], timeout_s: float
) -> UpstreamResponse:
    host, port = svc.hostport(ep.base_url)
    extra = b"Authorization: Bearer " + ep.api_key.encode() + b"\r\n" if ep.api_key else b""
    return await svc.upstream.post(
        host, port, PATH, orjson.dumps(body), extra, min(pool.connect_timeout_s, timeout_s)
    )


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
    pool, ep = pick(svc, pool_name)
    body: dict[str, Any] = {"model": ep.served_model_name, "messages": messages, "max_tokens": max_tokens}
    if temperature is not None:
        body["temperature"] = temperature
    state = svc.live.of(ep)
    state.begin(time.monotonic(), 0)
    try:
        # A timeout cancels the wait: the upstream client then closes the connection (the engine may
        # still answer on it), so a late answer never reaches a later request.
        async with asyncio.timeout(timeout_s):
            resp = await _post(svc, pool, ep, body, timeout_s)
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


def _texts(events: bytes) -> tuple[list[str], bool]:
    """The text pieces of complete SSE events of a chat completion stream, and whether it ended."""
    out: list[str] = []
    for event in events.split(b"\n\n"):
        if not event.startswith(b"data: "):
            continue
        if event.startswith(b"data: [DONE]"):
            return out, True
        try:
            obj = orjson.loads(event[6:])
            piece = obj["choices"][0]["delta"].get("content") if obj.get("choices") else None
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
            raise RemoteFailure("error", "the engine's stream holds no chat completion chunk") from None
        if isinstance(piece, str) and piece:
            out.append(piece)
    return out, False


class _Events:
    """The text pieces of a chat completion stream as its bytes come in (events complete or not)."""

    def __init__(self) -> None:
        self.buffer = b""

    def feed(self, chunk: bytes) -> tuple[list[str], bool]:
        # llama.cpp's server (sse-starlette) ends lines with CRLF, vLLM with LF.
        self.buffer = (self.buffer + chunk).replace(b"\r\n", b"\n")
        cut = self.buffer.rfind(b"\n\n")
        if cut < 0:
            return [], False
        events, self.buffer = self.buffer[: cut + 2], self.buffer[cut + 2 :]
        return _texts(events)


async def chat_stream(
    svc: Services, pool_name: str, messages: list[dict[str, Any]], *, max_tokens: int, timeout_s: float
) -> AsyncGenerator[str, None]:
    """The pool's engine's answer to `messages` as it streams: its text pieces. The first must come
    within `timeout_s` (RemoteFailure otherwise, before anything was yielded); after it the pool's
    inter-token and total timeouts apply, and a break raises RemoteFailure in the middle."""
    pool, ep = pick(svc, pool_name)
    body = {"model": ep.served_model_name, "messages": messages, "max_tokens": max_tokens, "stream": True}
    state = svc.live.of(ep)
    started = time.monotonic()
    state.begin(started, 0)
    resp: UpstreamResponse | None = None
    events = _Events()
    done = False
    pending: list[str] = []
    try:
        try:
            async with asyncio.timeout(timeout_s):
                resp = await _post(svc, pool, ep, body, timeout_s)
                if resp.status != 200:
                    raise RemoteFailure("error", f"{ep.id} answered HTTP {resp.status}")
                while not pending and not done:
                    chunk = await resp.readany()
                    if not chunk:
                        break
                    pending, done = events.feed(chunk)
        except TimeoutError:
            raise RemoteFailure("timeout", f"no text from {ep.id} within {timeout_s * 1000:g} ms") from None
        except OSError as exc:
            raise RemoteFailure("unavailable", f"{ep.id}: {type(exc).__name__}") from None
        for piece in pending:
            yield piece
        deadline = started + pool.total_timeout_s
        while not done:
            try:
                async with asyncio.timeout(
                    min(pool.inter_token_timeout_s, max(0.0, deadline - time.monotonic()))
                ):
                    chunk = await resp.readany()
            except TimeoutError:
                raise RemoteFailure("timeout", f"{ep.id} stopped in the middle of its answer") from None
            except OSError as exc:
                raise RemoteFailure("error", f"{ep.id} broke off its answer: {type(exc).__name__}") from None
            if not chunk:
                break
            pieces, done = events.feed(chunk)
            for piece in pieces:
                yield piece
        if not done:
            raise RemoteFailure("error", f"{ep.id} closed its stream before the end")
    except RemoteFailure:
        # Against the endpoint's breaker unless it refused the request itself (a 4xx: the stage's fault).
        if resp is None or not 400 <= resp.status < 500:
            state.failure(time.monotonic())
        raise
    else:
        state.success()
    finally:
        state.end()
        if resp is not None:
            resp.release()
