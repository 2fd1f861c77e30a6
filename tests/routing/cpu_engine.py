"""A controllable OpenAI-shaped CPU engine on loopback (aiohttp, in its own thread), registered as a ready
cpu-postprocess deployment the way tests register simulator engines: chain stages' remote calls go to
it, and a test makes it slow (a stage's timeout) or fail (HTTP 500) at will."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from nodes.lifecycle import engine_api_key
from nodes.models import Deployment, Host
from routing.models import RoutePool
from tests.routing.fleet import ensure_alias

CPU_ROLE = "cpu-postprocess"


def upper(system: str, user: str) -> str:
    return user.upper()


@dataclass
class CpuEngine:
    """What the engine answers (`reply(system, user)`), how (`delay_s`, `status`) and what it was asked."""

    reply: Callable[[str, str], str] = upper
    delay_s: float = 0.0
    status: int = 200
    port: int = 0
    api_key: str = ""
    # A streamed answer (`"stream": true`): one piece per word, this long apart; `break_after` pieces,
    # then the connection is cut (an engine that dies in the middle).
    piece_delay_s: float = 0.0
    break_after: int | None = None
    requests: list[dict[str, Any]] = field(default_factory=list)
    deployment: Deployment | None = None


def stream_pieces(text: str) -> list[str]:
    """How a streamed answer is cut: a word and the space after it (a leading space stays in front)."""
    return [p for p in re.split(r"(?<=\s)(?=\S)", text) if p]


async def _stream(
    request: web.Request, engine: CpuEngine, text: str, stopping: asyncio.Event
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)

    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        chunk = {
            "id": "chatcmpl-cpu",
            "object": "chat.completion.chunk",
            "model": "cpu",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    await response.write(event({"role": "assistant", "content": ""}))
    for n, piece in enumerate(stream_pieces(text)):
        if engine.break_after is not None and n >= engine.break_after:
            assert request.transport is not None
            request.transport.abort()
            return response
        if n and engine.piece_delay_s:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), engine.piece_delay_s)
        await response.write(event({"content": piece}))
    await response.write(event({}, "stop") + b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _app(engine: CpuEngine, stopping: asyncio.Event) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {engine.api_key}":
            return web.json_response({"error": {"message": "bad engine key"}}, status=401)
        body = await request.json()
        engine.requests.append(body)
        if engine.delay_s:
            # Cut short when the engine stops, so no handler is left pending at shutdown.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), engine.delay_s)
        if engine.status != 200:
            return web.json_response({"error": {"message": "engine failed"}}, status=engine.status)
        messages = body["messages"]
        text = engine.reply(messages[0]["content"], messages[-1]["content"])
        if body.get("stream"):
            return await _stream(request, engine, text, stopping)
        return web.json_response(
            {
                "id": "cmpl-cpu",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


@contextlib.contextmanager
def cpu_engine(pool: str = "cpu", served_name: str = "smollm-cpu") -> Iterator[CpuEngine]:
    """A CpuEngine serving `served_name`, a ready cpu-postprocess Deployment for it, and the RoutePool
    `pool` of role cpu-postprocess over it, for the block's duration."""
    engine = CpuEngine()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    stopping = asyncio.Event()
    runner = web.AppRunner(_app(engine, stopping), access_log=None, shutdown_timeout=1.0)

    async def start() -> None:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        engine.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()))
    thread.start()
    ready.wait(10)
    try:
        ensure_alias(served_name)
        host, _ = Host.objects.get_or_create(name="cpu-host", defaults={"address": "127.0.0.1"})
        engine.deployment = Deployment.objects.create(
            name=f"{served_name}-{engine.port}",
            model_version=ensure_alias(served_name).active_version,
            host=host,
            port=engine.port,
            served_model_name=served_name,
            max_model_len=2048,
            role=CPU_ROLE,
            state="ready",
            start_token=secrets.token_hex(8),
            engine="llamacpp",
        )
        engine.api_key = engine_api_key(engine.deployment)
        RoutePool.objects.create(name=pool, alias=served_name, role=CPU_ROLE)
        yield engine
    finally:
        loop.call_soon_threadsafe(stopping.set)
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
