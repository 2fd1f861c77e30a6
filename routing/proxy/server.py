"""The standalone proxy's own HTTP/1.1 server: a lean ASGI server for one app, the proxy.

`python -m routing.proxy` runs the proxy's ASGI app under this server instead of uvicorn (the console's
single-process `make run` still mounts the same app under uvicorn at `/v1/`). It parses with httptools,
as uvicorn does, but does less per request; docs/benchmarks.md ("Proxy") has the measurement:

- the whole request body is read before the app starts (the proxy needs all of it before it can do
  anything), so the first `receive()` returns at once and no per-request event or flow control is needed;
- `http.response.start` is held until the first body message, so status line, headers and body leave in
  one write (one syscall; uvicorn writes the head and the body separately);
- a streamed response without a content-length is sent chunked, and its last chunk and the terminator
  leave in one write.

What it keeps from a general server: keep-alive (HTTP/1.1 by default, HTTP/1.0 on request), pipelined
requests answered in order, `Expect: 100-continue`, limits on the request head (431) and body (413,
checked before and while reading, never buffered past the limit), 400 on a malformed request, an idle
keep-alive timeout, write back-pressure (a slow reader pauses the response), `http.disconnect` when the
client goes, and a graceful stop that lets requests in flight finish. Several worker processes share one
listening socket, each with its own event loop, as uvicorn's workers do.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import signal
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import unquote

import httptools
import uvloop

from routing.proxy.errors import ProxyError

log = logging.getLogger("inferchain.proxy.server")

Message = dict[str, Any]
App = Callable[
    [Message, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]
]

MAX_HEAD_BYTES = 64 * 1024
MAX_PIPELINED = 32  # requests queued behind the running one before reading pauses
KEEP_ALIVE_S = 75.0  # an idle keep-alive connection is closed after this (nginx's default)
SWEEP_S = 5.0
GRACE_S = 30.0  # how long a stop waits for requests in flight
BACKLOG = 2048

_STATUS_LINES: dict[int, bytes] = {}


def status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        try:
            reason = HTTPStatus(status).phrase.encode()
        except ValueError:
            reason = b"Client Closed Request" if status == 499 else b"Unknown"
        line = _STATUS_LINES[status] = b"HTTP/1.1 %d %s\r\n" % (status, reason)
    return line


def error_response(err: ProxyError) -> bytes:
    """A whole response for an error the server answers itself; the connection closes after it."""
    body = err.body()
    return (
        status_line(err.status)
        + b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body)
        + body
    )


def _too_large(limit: int) -> ProxyError:
    # Same status, code and words as the app's own check (routing/proxy/app.py, _read_body).
    return ProxyError(413, f"Request body is larger than {limit} bytes.", code="body_too_large")


class ServerState:
    """What the connections of one worker process share."""

    def __init__(self, app: App, max_body: int) -> None:
        self.app = app
        self.max_body = max_body
        self.connections: set[HttpProtocol] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.stopping = False
        self.server: tuple[str, int] | None = None


class Cycle:
    """One request and its response: the ASGI `receive` and `send` the app gets for it."""

    __slots__ = ("body", "chunked", "done", "headers", "keep_alive", "proto", "scope", "status", "waiter")

    def __init__(self, proto: HttpProtocol, scope: Message, body: bytes, keep_alive: bool) -> None:
        self.proto = proto
        self.scope = scope
        self.body: bytes | None = body
        self.keep_alive = keep_alive
        self.status = 0
        self.headers: Any = None
        self.chunked = False
        self.done = False
        self.waiter: asyncio.Future[None] | None = None

    async def receive(self) -> Message:
        if self.body is not None:
            body, self.body = self.body, None
            return {"type": "http.request", "body": body, "more_body": False}
        # The body is all in: the next event is the end, by hang-up or by the response completing.
        if not self.done and not self.proto.lost:
            if self.waiter is None:
                self.waiter = asyncio.get_running_loop().create_future()
            await asyncio.shield(self.waiter)
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self.status or self.done:
                raise RuntimeError("http.response.start sent twice")
            self.status = message["status"]
            self.headers = message.get("headers") or ()
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message type {kind!r}")
        if not self.status:
            raise RuntimeError("http.response.body before http.response.start")
        if self.done:
            raise RuntimeError("http.response.body after the response ended")
        body: bytes = message.get("body", b"")
        more: bool = message.get("more_body", False)
        if self.headers is not None:
            data = self._head(body, more)
            if self.scope["method"] == "HEAD":
                body = b""
        else:
            data = b""
        if self.chunked and body:
            body = b"%x\r\n%b\r\n" % (len(body), body)
        if not more:
            self.done = True
            if self.chunked:
                body += b"0\r\n\r\n"
        proto = self.proto
        if not proto.lost:
            assert proto.transport is not None
            proto.transport.write(data + body if data else body)
            if proto.paused:
                await proto.drain()
        if self.done:
            proto.response_complete(self)

    def _head(self, body: bytes, more: bool) -> bytes:
        """Status line and headers, framed by what the first body message tells (sent once)."""
        parts = [status_line(self.status)]
        has_length = False
        for name, value in self.headers:
            lname = name.lower()
            if lname == b"connection":
                if value.lower() == b"close":
                    self.keep_alive = False
                continue
            if lname == b"content-length":
                has_length = True
            elif lname == b"transfer-encoding":
                continue  # the server frames the body itself
            parts.append(lname + b": " + value + b"\r\n")
        self.headers = None
        if self.proto.state.stopping:
            self.keep_alive = False
        if not has_length:
            if not more:
                parts.append(b"content-length: %d\r\n" % len(body))
            elif self.scope["http_version"] == "1.1":
                self.chunked = True
                parts.append(b"transfer-encoding: chunked\r\n")
            else:
                self.keep_alive = False  # HTTP/1.0 without a length: the end of the body is the close
        if not self.keep_alive:
            parts.append(b"connection: close\r\n")
        elif self.scope["http_version"] == "1.0":
            parts.append(b"connection: keep-alive\r\n")
        parts.append(b"\r\n")
        return b"".join(parts)


class HttpProtocol(asyncio.Protocol):
    """One client connection: parses requests with httptools and runs the app once per request."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.loop = asyncio.get_running_loop()
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.client: tuple[str, int] | None = None
        self.lost = False
        self.paused = False
        self.reading_paused = False
        self._drain: asyncio.Future[None] | None = None
        self.cycle: Cycle | None = None
        self.pending: deque[Cycle] = deque()
        self.last_active = time.monotonic()
        self._rejected = False  # for the connection: after a refusal nothing more on it is trusted
        self._reset()

    def _reset(self) -> None:
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0
        self._body: list[bytes] = []
        self._body_size = 0
        self._scope: Message | None = None

    # ---- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass
        peer = transport.get_extra_info("peername")
        self.client = (peer[0], peer[1]) if isinstance(peer, tuple) else None
        self.state.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.state.connections.discard(self)
        self.pending.clear()
        if self.cycle is not None and self.cycle.waiter is not None and not self.cycle.waiter.done():
            self.cycle.waiter.set_result(None)
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._drain = None

    async def drain(self) -> None:
        if not self.paused or self.lost:
            return
        if self._drain is None:
            self._drain = self.loop.create_future()
        await asyncio.shield(self._drain)

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._reject(ProxyError(400, "Protocol upgrades are not supported.", code="bad_request"))
        except httptools.HttpParserError:
            self._reject(ProxyError(400, "Malformed HTTP request.", code="bad_request"))

    # ---- httptools callbacks ------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._reset()

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_bytes += len(url)
        if self._head_bytes > MAX_HEAD_BYTES:
            self._reject(ProxyError(431, "Request head is too large.", code="request_header_too_large"))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > MAX_HEAD_BYTES:
            self._reject(ProxyError(431, "Request head is too large.", code="request_header_too_large"))
            return
        self._headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        if self._rejected:
            return
        parser = self.parser
        parsed = httptools.parse_url(self._url)
        raw_path = parsed.path or b"/"
        path = raw_path.decode("latin-1")
        if "%" in path:
            path = unquote(path)
        limit = self.state.max_body
        expect_continue = False
        for name, value in self._headers:
            if name == b"content-length":
                if not value.strip().isdigit():
                    self._reject(ProxyError(400, "Malformed content-length header.", code="bad_request"))
                    return
                if int(value) > limit:
                    self._reject(_too_large(limit))
                    return
            elif name == b"expect" and value.lower() == b"100-continue":
                expect_continue = True
        self._scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": parser.get_http_version(),
            "server": self.state.server,
            "client": self.client,
            "scheme": "http",
            "method": parser.get_method().decode("ascii"),
            "root_path": "",
            "path": path,
            "raw_path": raw_path,
            "query_string": parsed.query or b"",
            "headers": self._headers,
        }
        if expect_continue and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        if self._rejected:
            return
        self._body_size += len(body)
        if self._body_size > self.state.max_body:
            self._reject(_too_large(self.state.max_body))
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._rejected or self._scope is None or self.lost:
            return
        parts = self._body
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        cycle = Cycle(self, self._scope, body, self.parser.should_keep_alive() and not self.state.stopping)
        if self.cycle is None:
            self._start(cycle)
        else:
            self.pending.append(cycle)
            if len(self.pending) >= MAX_PIPELINED and self.transport is not None:
                self.transport.pause_reading()
                self.reading_paused = True

    # ---- requests -----------------------------------------------------------------------------------

    def _reject(self, err: ProxyError) -> None:
        """Answer a request the app never sees, then close: what follows on the wire cannot be trusted."""
        if self._rejected:
            return
        self._rejected = True
        if self.transport is None or self.lost:
            return
        if self.cycle is None:
            self.transport.write(error_response(err))
            self.transport.close()
        else:
            # A request is still being answered on this connection: stop reading and close after it.
            self.pending.clear()
            self.transport.pause_reading()
            self.cycle.keep_alive = False

    def _start(self, cycle: Cycle) -> None:
        self.cycle = cycle
        task = self.loop.create_task(self._run(cycle))
        self.state.tasks.add(task)
        task.add_done_callback(self.state.tasks.discard)

    async def _run(self, cycle: Cycle) -> None:
        try:
            await self.state.app(cycle.scope, cycle.receive, cycle.send)
        except Exception:
            log.exception("proxy server: the app failed")
            if not cycle.status and not cycle.done and not self.lost and self.transport is not None:
                err = ProxyError(
                    500, "The proxy failed unexpectedly.", type="server_error", code="internal_error"
                )
                self.transport.write(error_response(err))
                self.transport.close()
                return
        if not cycle.done and not self.lost and self.transport is not None:
            # The app returned without finishing its response: the client cannot tell where it ends.
            if not cycle.status:
                log.error("proxy server: the app returned without a response for %s", cycle.scope["path"])
                err = ProxyError(
                    500, "The proxy sent no response.", type="server_error", code="internal_error"
                )
                self.transport.write(error_response(err))
            self.transport.close()

    def response_complete(self, cycle: Cycle) -> None:
        if cycle.waiter is not None and not cycle.waiter.done():
            cycle.waiter.set_result(None)
        self.last_active = time.monotonic()
        if self.lost or self.transport is None:
            return
        if not cycle.keep_alive or self.state.stopping:
            self.transport.close()
            return
        self.cycle = None
        if self.pending:
            self._start(self.pending.popleft())
        if self.reading_paused and len(self.pending) < MAX_PIPELINED // 2:
            self.reading_paused = False
            self.transport.resume_reading()

    def close_if_idle(self, idle_for: float, now: float) -> None:
        if (
            self.cycle is None
            and not self.lost
            and self.transport is not None
            and now - self.last_active >= idle_for
        ):
            self.transport.close()


# ---- running --------------------------------------------------------------------------------------


def load_app(path: str) -> App:
    """`module:attribute`, imported in the worker (each worker builds its own app and state)."""
    module, _, attr = path.partition(":")
    app: App = getattr(importlib.import_module(module), attr)
    return app


class Lifespan:
    """Drives the app's ASGI lifespan protocol: startup before serving, shutdown after."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.inbox: asyncio.Queue[Message] = asyncio.Queue()
        self.outbox: asyncio.Queue[Message] = asyncio.Queue()
        self.task: asyncio.Future[None] | None = None

    async def _receive(self) -> Message:
        return await self.inbox.get()

    async def _send(self, message: Message) -> None:
        await self.outbox.put(message)

    async def startup(self) -> None:
        self.task = asyncio.ensure_future(
            self.app({"type": "lifespan", "asgi": {"version": "3.0"}}, self._receive, self._send)
        )
        await self.inbox.put({"type": "lifespan.startup"})
        message = await self.outbox.get()
        if message["type"] != "lifespan.startup.complete":
            raise RuntimeError(f"proxy startup failed: {message.get('message', message['type'])}")

    async def shutdown(self) -> None:
        if self.task is None or self.task.done():
            return
        await self.inbox.put({"type": "lifespan.shutdown"})
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.outbox.get(), GRACE_S)


async def serve_socket(sock: socket.socket, app: App, max_body: int, stop: asyncio.Event) -> None:
    """Serve `app` on an already-bound listening socket until `stop` is set, then stop gracefully."""
    loop = asyncio.get_running_loop()
    state = ServerState(app, max_body)
    addr = sock.getsockname()
    state.server = (str(addr[0]), int(addr[1]))
    lifespan = Lifespan(app)
    await lifespan.startup()
    server = await loop.create_server(lambda: HttpProtocol(state), sock=sock, backlog=BACKLOG)

    async def sweep() -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            now = time.monotonic()
            for conn in list(state.connections):
                conn.close_if_idle(KEEP_ALIVE_S, now)

    sweeper = loop.create_task(sweep())
    try:
        await stop.wait()
    finally:
        sweeper.cancel()
        state.stopping = True
        server.close()
        now = time.monotonic()
        for conn in list(state.connections):
            conn.close_if_idle(0.0, now)  # idle ones now; busy ones close after their response
        deadline = now + GRACE_S
        while state.tasks and time.monotonic() < deadline:
            await asyncio.wait(set(state.tasks), timeout=max(0.0, deadline - time.monotonic()))
        for conn in list(state.connections):
            if conn.transport is not None:
                conn.transport.close()
        await lifespan.shutdown()


def _worker(sock: socket.socket, app_path: str, max_body_setting: Callable[[], int]) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        app = load_app(app_path)
        await serve_socket(sock, app, max_body_setting(), stop)

    uvloop.run(main())


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)
    sock.setblocking(False)
    sock.set_inheritable(True)
    return sock


def run(app_path: str, host: str, port: int, workers: int, max_body_setting: Callable[[], int]) -> None:
    """Bind once, then serve in this process (one worker) or in `workers` forked children."""
    sock = bind(host, port)
    if workers <= 1:
        _worker(sock, app_path, max_body_setting)
        return
    children: dict[int, int] = {}

    def spawn(slot: int) -> None:
        pid = os.fork()
        if pid == 0:  # child
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            code = 0
            try:
                _worker(sock, app_path, max_body_setting)
            except BaseException:
                log.exception("proxy worker %d failed", slot)
                code = 1
            os._exit(code)
        children[pid] = slot

    stopping = False

    def on_signal(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for pid in list(children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    for slot in range(workers):
        spawn(slot)
    restarts: deque[float] = deque(maxlen=10)
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        slot = children.pop(pid, -1)
        if slot < 0 or stopping:
            continue
        log.error("proxy worker %d (pid %d) exited with status %d; starting a new one", slot, pid, status)
        restarts.append(time.monotonic())
        if len(restarts) == restarts.maxlen and restarts[-1] - restarts[0] < 60:
            log.error("proxy workers keep dying (10 in a minute); stopping")
            on_signal(signal.SIGTERM, None)
            continue
        time.sleep(0.5)
        spawn(slot)
    sock.close()
