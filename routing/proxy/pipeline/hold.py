"""Step 8 for a streamed answer whose chain has a holding stage (a remote post-stage, which rewrites the
whole answer): the engine's stream is read to its end, then each choice's text goes through the
answer stages.

When the last holding stage is a remote one and the answer has one choice, the rewrite streams: the
CPU engine's answer is relayed piece by piece (through the answer stages after it, a guard say), so the
client's first token waits for the generation plus the CPU engine's first token, not for its whole
answer. Otherwise (several choices) the new text goes out as one batch of events.

Nothing reaches the client before the rewrite's first piece, so until then a failure is retried on
another endpoint like one before the first byte, and a stage that refuses (or fails closed) is an
ordinary error answer. After it, a break ends the stream with an OpenAI-shaped error event, as a break
of the engine's own stream does.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from typing import Any

import orjson

from routing.proxy.config import Pool
from routing.proxy.errors import ProxyError, error_body
from routing.proxy.pipeline import remote, stages
from routing.proxy.pipeline.context import RequestContext, RetryableUpstreamError, Send, client_gone_error
from routing.proxy.pipeline.relay import stream_events, text_slots
from routing.proxy.pipeline.respond import SSE_HEADERS, response_headers
from routing.proxy.services import Services
from routing.proxy.upstream import UpstreamResponse

DONE = b"data: [DONE]\n\n"


class HeldAnswer:
    """A whole stream's events with each choice's text taken out, to be put back changed: the choice's
    first text chunk gets the new text, later text-only chunks are dropped."""

    def __init__(self, ctx: RequestContext, events: bytes) -> None:
        self.objs: list[tuple[dict[str, Any] | None, bytes]] = []
        self.pieces: dict[int, list[str]] = {}
        # Per choice: the event that carried its first text, and where in it the text goes.
        self.first: dict[int, tuple[int, dict[str, Any], str]] = {}
        for event, obj, keep in stream_events(ctx, events, ctx.client_wants_usage):
            if not keep:
                continue
            if obj is not None:
                for slot in text_slots(obj, "delta"):
                    if slot.text is not None:
                        self.pieces.setdefault(slot.index, []).append(slot.text)
                        self.first.setdefault(slot.index, (len(self.objs), slot.holder, slot.field))
                        slot.holder[slot.field] = ""
            self.objs.append((obj, event))

    def text(self, index: int) -> str:
        return "".join(self.pieces[index])

    def put(self, index: int, text: str) -> None:
        _, holder, field = self.first[index]
        holder[field] = text

    def new_text(self, index: int) -> str:
        """What `put` gave choice `index`."""
        _, holder, field = self.first[index]
        return str(holder[field])

    def events(self, start: int = 0, stop: int | None = None) -> bytes:
        """The events from `start` to `stop`, less the chunks left with nothing for the client."""
        out: list[bytes] = []
        for obj, event in self.objs[start:stop]:
            if obj is None:
                out.append(event + b"\n\n")
            elif not _emptied(obj):
                out.append(b"data: " + orjson.dumps(obj) + b"\n\n")
        return b"".join(out)

    def piece(self, index: int, text: str) -> bytes:
        """One more chunk of choice `index`'s text, shaped like the chunk that carried its first text."""
        at, _, field = self.first[index]
        obj = self.objs[at][0]
        assert obj is not None
        choice: dict[str, Any] = {"index": index, "finish_reason": None}
        if field == "content":
            choice["delta"] = {"content": text}
        else:
            choice["text"] = text
        chunk = {k: v for k, v in obj.items() if k != "usage"}
        chunk["choices"] = [choice]
        return b"data: " + orjson.dumps(chunk) + b"\n\n"


def _emptied(obj: dict[str, Any]) -> bool:
    """A chunk left with nothing for the client: every choice's text taken out, nothing else in it."""
    choices = obj.get("choices")
    if not choices or obj.get("usage"):
        return False
    for choice in choices:
        if not isinstance(choice, dict) or choice.get("finish_reason") is not None:
            return False
        delta = choice.get("delta")
        if isinstance(delta, dict):
            if any(v not in ("", None) for v in delta.values()):
                return False
        elif choice.get("text"):
            return False
    return True


async def read_all(ctx: RequestContext, pool: Pool, resp: UpstreamResponse, deadline: float) -> bytes:
    """The engine's whole stream, under the pool's inter-token and total timeouts."""
    parts: list[bytes] = []
    if not resp.complete:
        ctx.deadline(deadline, pool.inter_token_timeout_s)
    try:
        while True:
            ctx.progress_at = time.perf_counter()
            chunk = resp.read_nowait()
            if chunk is None:
                chunk = await resp.readany()
            if not chunk:
                break
            parts.append(chunk)
    except TimeoutError:
        raise RetryableUpstreamError("timed out before the end of the answer", 504) from None
    except OSError as exc:
        if ctx.client_gone:
            raise client_gone_error() from None
        raise RetryableUpstreamError(f"stream failed before its end: {type(exc).__name__}") from None
    finally:
        ctx.clear_deadline()
    events = b"".join(parts)
    if ctx.dialect is not None:
        events = ctx.dialect.events(events)
    if DONE.rstrip() not in events:
        raise RetryableUpstreamError("stream closed before its end")
    return events


async def stream(
    svc: Services,
    ctx: RequestContext,
    pool: Pool,
    resp: UpstreamResponse,
    started: float,
    deadline: float,
    send: Send,
) -> None:
    chain = ctx.chain
    assert chain is not None
    answer = HeldAnswer(ctx, await read_all(ctx, pool, resp, deadline))
    last = max(i for i, s in enumerate(chain.answer) if s.holds)
    rewriter = chain.answer[last]
    if isinstance(rewriter, stages.Remote) and len(answer.pieces) == 1:
        (index,) = answer.pieces
        before, after = chain.answer[:last], chain.answer[last + 1 :]
        text = await stages.held_text(ctx, svc, index, answer.text(index), before)
        t0 = time.perf_counter()
        opened = await rewriter.open_rewrite(ctx, svc, text)
        if opened is not None:
            await _relay_rewrite(ctx, answer, index, rewriter, after, opened, t0, started, send)
            return
        _spent(ctx, rewriter, t0)
        # Failed open: the answer as it was, through the stages after the rewriter.
        answer.put(index, await stages.held_text(ctx, svc, index, text, after))
    else:
        for index in answer.pieces:
            answer.put(index, await stages.held_text(ctx, svc, index, answer.text(index)))
    if ctx.collect_text:
        ctx.response_parts.extend(answer.new_text(i) for i in answer.pieces)
    out = answer.events()
    ctx.status = 200
    ctx.first_token_out(started)  # the answer's first text reaches the client now
    await send({"type": "http.response.start", "status": 200, "headers": response_headers(ctx, SSE_HEADERS)})
    await send({"type": "http.response.body", "body": out})


def _spent(ctx: RequestContext, stage: stages.Stage, t0: float) -> None:
    run = stages.run_of(ctx)
    run.spent[stage.name] = run.spent.get(stage.name, 0.0) + time.perf_counter() - t0


async def _relay_rewrite(
    ctx: RequestContext,
    answer: HeldAnswer,
    index: int,
    rewriter: stages.Remote,
    after: tuple[stages.Stage, ...],
    opened: tuple[str, AsyncGenerator[str, None]],
    t0: float,
    started: float,
    send: Send,
) -> None:
    """The CPU engine's rewrite to the client as it streams: the engine's events up to the choice's
    first text chunk, the rewrite's pieces (through the stages after the rewriter), then the rest of
    the engine's events (finish reason, usage)."""
    first, pieces = opened
    at = answer.first[index][0]
    ctx.status = 200
    await send({"type": "http.response.start", "status": 200, "headers": response_headers(ctx, SSE_HEADERS)})
    final = b""
    try:
        out = stages.through(ctx, after, index, first, False)
        ctx.first_token_out(started)
        await send(
            {
                "type": "http.response.body",
                # (A guard after the rewriter may hold the first piece back: then no text chunk yet.)
                "body": answer.events(0, at + 1) + (answer.piece(index, out) if out else b""),
                "more_body": True,
            }
        )
        if ctx.collect_text:
            ctx.response_parts.append(out)
        async for piece in pieces:
            if ctx.client_gone:
                break
            out = stages.through(ctx, after, index, piece, False)
            if out:
                if ctx.collect_text:
                    ctx.response_parts.append(out)
                await send(
                    {"type": "http.response.body", "body": answer.piece(index, out), "more_body": True}
                )
        out = stages.through(ctx, after, index, "", True)
        final = (answer.piece(index, out) if out else b"") + answer.events(at + 1)
    except remote.RemoteFailure as exc:
        # Too late to fail open or closed: the client has part of the rewrite.
        stages.run_of(ctx).outcomes[rewriter.name] = f"{exc.why}, broke off"
        ctx.status, ctx.error_type = 502, "stage_broke_off"
        event = error_body(
            f"The stage '{rewriter.name}' of the chain '{rewriter.chain}' broke off in the middle of the "
            "answer; the output above is incomplete.",
            type="server_error",
            code="stage_broke_off",
        )
        final = b"data: " + event + b"\n\n" + DONE
    except ProxyError as err:  # a stage after the rewriter refused it (a guard)
        ctx.error_type = err.code or err.type
        final = b"data: " + err.body() + b"\n\n" + DONE
    finally:
        await pieces.aclose()  # (a client gone in the middle: the CPU engine's connection is closed)
        _spent(ctx, rewriter, t0)
    if ctx.client_gone:
        ctx.status, ctx.error_type = 499, "client_disconnected"
        return
    await send({"type": "http.response.body", "body": final})
