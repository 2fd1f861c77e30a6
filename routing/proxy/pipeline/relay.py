"""Step 8, relay: the engine's answer to the client, whole or as a stream; usage read on the way.

A stream's first chunk is awaited before the client is answered (until then a failure is retryable);
after it, every batch of events goes out as it comes, and a break in the middle ends the stream with an
OpenAI-shaped error event.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from routing.proxy import metrics as m
from routing.proxy.config import Pool
from routing.proxy.errors import ProxyError, error_body
from routing.proxy.pipeline import stages
from routing.proxy.pipeline.context import RequestContext, RetryableUpstreamError, Send, client_gone_error
from routing.proxy.pipeline.read import unsupported_endpoint
from routing.proxy.pipeline.respond import JSON_HEADERS, SSE_HEADERS, response_headers, send_raw
from routing.proxy.services import Services
from routing.proxy.upstream import UpstreamResponse

FIRST_TOKEN = re.compile(rb'"(?:content|text)": ?"[^"]')


def is_openai_error(data: bytes) -> bool:
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return isinstance(parsed, dict) and isinstance(parsed.get("error"), dict)


async def whole(
    svc: Services, ctx: RequestContext, resp: UpstreamResponse, path: str, deadline: float, send: Send
) -> None:
    """A non-streamed answer (or any error answer), read whole and passed on."""
    try:
        if not resp.complete:
            ctx.deadline(deadline)
        data = await resp.read()
    except TimeoutError:
        raise RetryableUpstreamError("total timeout", 504) from None
    except OSError as exc:
        if ctx.client_gone:
            raise client_gone_error() from None
        raise RetryableUpstreamError(f"read failed: {type(exc).__name__}") from None
    status = resp.status
    if ctx.dialect is not None:
        if status == 200:
            data = ctx.dialect.whole([data])
        elif status >= 400:
            status, data = ctx.dialect.error(status, data)
    await answer(svc, ctx, status, data, path, send)


async def answer(svc: Services, ctx: RequestContext, status: int, data: bytes, path: str, send: Send) -> None:
    """A whole answer (or an error answer) through the answer stages, read for usage, and sent."""
    # No time to first token for a whole answer: it arrives at once, so TTFT stays empty.
    ctx.status = status
    if status == 200:
        if ctx.stage_run is not None and ctx.stage_run.tap is not None:
            ctx.stage_run.tap(data)  # the raw answer, before post-stages change it
        if ctx.chain is not None and ctx.chain.holds:
            ctx.clear_deadline()  # the engine's part is done; the stages have their own timeouts
            data = await held_whole(svc, ctx, data)
        elif ctx.chain is not None and ctx.chain.answer:
            data = staged_whole(ctx, data)
        usage_from(ctx, data)
    elif status >= 400:
        if status in (404, 405) and not is_openai_error(data):
            # The engine has no such route (FastAPI's {"detail": "Not Found"}).
            raise unsupported_endpoint("POST", path, ctx.alias)
        ctx.error_type = f"upstream_{status}"
    await send_raw(send, status, data, response_headers(ctx, JSON_HEADERS))


async def engine_refused(
    svc: Services, ctx: RequestContext, resp: UpstreamResponse, path: str, deadline: float, send: Send
) -> bool:
    """A 5xx that the engine's dialect reads as the client's mistake is answered as such (True); any
    other (False) is the engine's failure, retried elsewhere."""
    assert ctx.dialect is not None
    try:
        if not resp.complete:
            ctx.deadline(deadline)
        data = await resp.read()
    except (TimeoutError, OSError):
        return False
    status, data = ctx.dialect.error(resp.status, data)
    if status >= 500:
        return False
    await answer(svc, ctx, status, data, path, send)
    return True


def cached_tokens(usage: dict[str, Any]) -> int | None:
    """The engine's reported prefix-cache hit (`prompt_tokens_details.cached_tokens`; None when it does
    not report one): the predictors learn from it (routing/proxy/predict.py)."""
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) else None


def usage_from(ctx: RequestContext, data: bytes) -> None:
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return
    usage = parsed.get("usage") if isinstance(parsed, dict) else None
    if isinstance(usage, dict):
        ctx.completion_tokens = usage.get("completion_tokens") or 0
        ctx.usage_prompt_tokens = usage.get("prompt_tokens")
        ctx.usage_cached_tokens = cached_tokens(usage)
    if ctx.collect_text and isinstance(parsed, dict):
        ctx.response_parts.extend(texts(parsed, "message"))


async def stream(
    svc: Services,
    ctx: RequestContext,
    pool: Pool,
    resp: UpstreamResponse,
    started: float,
    deadline: float,
    send: Send,
) -> None:
    client_wants_usage = ctx.client_wants_usage
    # Wait for the first chunk before answering the client: until then a failure is retryable.
    try:
        first = resp.read_nowait()
        if first is None:
            first = await resp.readany()  # still under the first-byte deadline set before the call
    except TimeoutError:
        raise RetryableUpstreamError("no first token before the first-byte timeout", 504) from None
    except OSError as exc:
        if ctx.client_gone:
            raise client_gone_error() from None
        raise RetryableUpstreamError(f"stream failed before first byte: {type(exc).__name__}") from None
    if not first:
        raise RetryableUpstreamError("stream closed before first byte")
    ctx.status = 200
    await send({"type": "http.response.start", "status": 200, "headers": response_headers(ctx, SSE_HEADERS)})
    buffer = b""
    chunks = 0
    done = False
    ended = False
    chunk: bytes = first
    log_text = ctx.collect_text
    tap = ctx.stage_run.tap if ctx.stage_run is not None else None
    # A short answer is usually all in by now: then nothing below waits, and no timer is needed.
    if resp.complete:
        ctx.clear_deadline()
    else:
        ctx.deadline(deadline, pool.inter_token_timeout_s)
    try:
        while True:
            ctx.progress_at = time.perf_counter()
            buffer += chunk
            cut = buffer.rfind(b"\n\n")
            if cut >= 0:
                events, buffer = buffer[: cut + 2], buffer[cut + 2 :]
                if ctx.dialect is not None:
                    events = ctx.dialect.events(events)
                # TTFT is the first generated text, not the first byte (engines send the role first).
                if ctx.ttft_s is None and FIRST_TOKEN.search(events):
                    ctx.first_token_out(started)
                if tap is not None:
                    tap(events)  # the raw events, before post-stages change them
                if ctx.chain is not None and ctx.chain.answer:
                    try:
                        out = staged_events(ctx, events, client_wants_usage, log_text)
                    except RefusedMidStream as refused:
                        # The answer is under way: what passed goes out, then the stage's error ends
                        # it, as OpenAI ends a stream a filter stopped.
                        ctx.error_type = refused.error.code or refused.error.type
                        out = refused.passed + b"data: " + refused.error.body() + b"\n\ndata: [DONE]\n\n"
                        events = out
                else:
                    out = filter_events(ctx, events, client_wants_usage, log_text)
                chunks += events.count(b"data: ") - events.count(b"data: [DONE]")
                if b"data: [DONE]" in events:
                    done = True
                if out:
                    # The last events and the end of the response go out in one write.
                    await send({"type": "http.response.body", "body": out, "more_body": not done})
                    ended = done
            if done:
                break
            chunk = await resp.readany()
            if not chunk:
                break
    except (TimeoutError, OSError) as exc:
        ctx.error_type = "upstream_timeout" if isinstance(exc, TimeoutError) else "upstream_disconnected"
    if ctx.client_gone:
        # Nobody to tell; the engine already saw its connection close and stopped generating.
        ctx.status = 499
        ctx.error_type = "client_disconnected"
        if ctx.completion_tokens is None:
            ctx.completion_tokens = max(0, chunks - 1)
        return
    if not done:
        if not ctx.error_type:
            ctx.error_type = "upstream_disconnected"
        ctx.status = 502 if ctx.error_type == "upstream_disconnected" else 504
        ep = ctx.endpoint
        if ep is not None and svc.live.of(ep).failure(time.monotonic()):
            m.EJECTIONS.labels(ep.id).inc()
        event = error_body(
            "The model server stopped in the middle of the answer; the output above is incomplete.",
            type="server_error",
            code=ctx.error_type,
        )
        with contextlib.suppress(Exception):
            await send(
                {
                    "type": "http.response.body",
                    "body": b"data: " + event + b"\n\ndata: [DONE]\n\n",
                    "more_body": True,
                }
            )
    if ctx.completion_tokens is None:
        ctx.completion_tokens = max(0, chunks - 1)  # an estimate: one token per content chunk
    if not ended:
        await send({"type": "http.response.body", "body": b""})


@dataclass(frozen=True, slots=True)
class TextSlot:
    """Where one choice of an answer keeps its text: `holder[field]`."""

    index: int
    choice: dict[str, Any]
    holder: dict[str, Any]
    field: str

    @property
    def text(self) -> str | None:
        text = self.holder.get(self.field)
        return text if isinstance(text, str) else None


def text_slots(obj: dict[str, Any], box: str) -> Iterator[TextSlot]:
    """Each choice's text slot, for every reader and rewriter of answer text (the relay, the answer
    stages, a held answer). `box` is "message" in a whole answer and "delta" in a stream chunk, whose
    "content" holds a chat choice's text; a completions choice holds it in its own "text"."""
    for n, choice in enumerate(obj.get("choices") or []):
        if isinstance(choice, dict):
            inner = choice.get(box)
            holder, field = (inner, "content") if isinstance(inner, dict) else (choice, "text")
            yield TextSlot(choice.get("index", n), choice, holder, field)


def texts(obj: dict[str, Any], box: str) -> list[str]:
    """The text of each choice that has some (for the request log)."""
    return [slot.text for slot in text_slots(obj, box) if slot.text is not None]


def stream_events(
    ctx: RequestContext, events: bytes, client_wants_usage: bool
) -> Iterator[tuple[bytes, dict[str, Any] | None, bool]]:
    """Each SSE event of a batch with `read_event`'s verdict: (event, its JSON object, client gets it)."""
    for event in events.split(b"\n\n"):
        if event:
            yield (event, *read_event(ctx, event, client_wants_usage))


def read_event(
    ctx: RequestContext, event: bytes, client_wants_usage: bool
) -> tuple[dict[str, Any] | None, bool]:
    """One SSE event: its JSON object (None when it has none) and whether the client gets it. Usage is
    read into `ctx`; the usage-only chunk is dropped when the client did not ask for usage."""
    if not event.startswith(b"data: {"):
        return None, True
    try:
        obj = orjson.loads(event[6:])
    except orjson.JSONDecodeError:
        return None, True
    if not isinstance(obj, dict):
        return None, True
    keep = True
    usage = obj.get("usage")
    if isinstance(usage, dict):
        ctx.completion_tokens = usage.get("completion_tokens") or 0
        ctx.usage_prompt_tokens = usage.get("prompt_tokens")
        ctx.usage_cached_tokens = cached_tokens(usage)
        if not obj.get("choices") and not client_wants_usage:
            keep = False
    return obj, keep


def filter_events(ctx: RequestContext, events: bytes, client_wants_usage: bool, log_text: bool) -> bytes:
    """Read usage from the stream; drop the usage-only chunk when the client did not ask for it."""
    if not log_text:
        return usage_event(ctx, events, client_wants_usage)
    kept: list[bytes] = []
    for event, obj, keep in stream_events(ctx, events, client_wants_usage):
        if obj is not None:
            ctx.response_parts.extend(texts(obj, "delta"))
        if keep:
            kept.append(event + b"\n\n")
    return b"".join(kept)


def usage_event(ctx: RequestContext, events: bytes, client_wants_usage: bool) -> bytes:
    """Parse only the last event that carries usage (found by its bytes); the rest pass untouched.

    `"usage":{` cannot occur inside a JSON string (its quotes would be escaped), so the marker finds
    exactly the events with a usage object. The engine sends usage in the last chunk (with
    `continuous_usage_stats` in every chunk), so the last one in a batch is the current total.
    """
    at = events.rfind(b'"usage":{')
    if at < 0:
        at = events.rfind(b'"usage": {')
        if at < 0:
            return events
    begin = events.rfind(b"\n\n", 0, at)
    begin = 0 if begin < 0 else begin + 2
    end = events.find(b"\n\n", at)
    end = len(events) if end < 0 else end + 2
    event = events[begin:end]
    if not event.startswith(b"data: {"):
        return events
    try:
        obj = orjson.loads(event[6:])
    except orjson.JSONDecodeError:
        return events
    usage = obj.get("usage") if isinstance(obj, dict) else None
    if not isinstance(usage, dict):
        return events
    ctx.completion_tokens = usage.get("completion_tokens") or 0
    ctx.usage_prompt_tokens = usage.get("prompt_tokens")
    ctx.usage_cached_tokens = cached_tokens(usage)
    if client_wants_usage or obj.get("choices"):
        return events
    return events[:begin] + events[end:]


def staged_whole(ctx: RequestContext, data: bytes) -> bytes:
    """A whole answer's choices through the chain's answer stages (a ProxyError refuses it)."""
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return data
    if not isinstance(parsed, dict):
        return data
    for slot in text_slots(parsed, "message"):
        if slot.text is not None:
            slot.holder[slot.field] = stages.answer_text(ctx, slot.index, slot.text) + stages.answer_text(
                ctx, slot.index, None
            )
    return orjson.dumps(parsed)


class RefusedMidStream(Exception):
    """A stage refused a streamed answer at one event of a batch: the events before it passed."""

    def __init__(self, passed: bytes, error: ProxyError) -> None:
        super().__init__(error.message)
        self.passed = passed
        self.error = error


def staged_events(ctx: RequestContext, events: bytes, client_wants_usage: bool, log_text: bool) -> bytes:
    """`filter_events` with each choice's text passed through the chain's answer stages; what a stage
    holds back goes out with the choice's last chunk (the one with its finish_reason).

    A stage that refuses the answer (a guard's blocked term) raises RefusedMidStream with the events
    before the one it refused: the client gets the same text however the engine's bytes were batched
    (a slow proxy reads many events at once; refusing the whole batch sent nothing before the error)."""
    kept: list[bytes] = []
    for event, obj, keep in stream_events(ctx, events, client_wants_usage):
        if obj is not None:
            try:
                _stage_chunk(ctx, obj, log_text)
            except ProxyError as err:
                raise RefusedMidStream(b"".join(kept), err) from None
            event = b"data: " + orjson.dumps(obj)
        if keep:
            kept.append(event + b"\n\n")
    return b"".join(kept)


def _stage_chunk(ctx: RequestContext, obj: dict[str, Any], log_text: bool) -> None:
    """One stream chunk's text through the answer stages, in place."""
    for slot in text_slots(obj, "delta"):
        text = slot.text
        out = stages.answer_text(ctx, slot.index, text) if text is not None else ""
        if slot.choice.get("finish_reason") is not None:
            out += stages.answer_text(ctx, slot.index, None)
        if text is not None or out:
            slot.holder[slot.field] = out
        if log_text and out:
            ctx.response_parts.append(out)


async def held_whole(svc: Services, ctx: RequestContext, data: bytes) -> bytes:
    """`staged_whole` for a chain with a holding stage (a remote rewrite): each choice's text whole
    through the answer stages, which may call a CPU engine."""
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return data
    if not isinstance(parsed, dict):
        return data
    for slot in text_slots(parsed, "message"):
        if slot.text is not None:
            slot.holder[slot.field] = await stages.held_text(ctx, svc, slot.index, slot.text)
    return orjson.dumps(parsed)
