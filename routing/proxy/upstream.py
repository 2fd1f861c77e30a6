"""A small keep-alive HTTP/1.1 client for engine calls: asyncio protocols plus the httptools parser.

Chosen by measurement over aiohttp's client (see docs/benchmarks.md): the proxy only ever sends a
JSON POST to a known engine and relays a JSON or SSE answer, so it needs none of a general client's
layers (cookies, redirects, tracing, per-request timers). Connections are pooled per (host, port);
a reused connection that turns out to be closed by the engine before answering is replaced once,
transparently, since nothing was processed.
"""

from __future__ import annotations

import asyncio
import collections
import socket
from collections.abc import Callable
from typing import Any

import httptools

# Above this much unread body the connection stops reading from the engine until the client catches up.
HIGH_WATER = 1 << 20
MAX_IDLE_PER_ENDPOINT = 256

# A non-streaming answer arrives whole, so its only timer is the pool's total timeout (600 s by default):
# an engine host that drops off the network (a cut link, a powered-off host: packets vanish, nothing
# answers) would hold such a request, and every pooled connection to it, that long. The kernel can tell
# a silent peer from a busy one: a busy engine's kernel acknowledges keepalive probes and data at once,
# however long the model takes. So a connection whose peer acknowledges nothing for about 5 s is closed
# by the kernel, the request fails over to another engine before anything reached the client
# (tests/routing/test_netns_remote_engine.py), and a live engine is never cut short.
KEEPALIVE_IDLE_S = 2  # quiet this long, then probe
KEEPALIVE_INTERVAL_S = 1
KEEPALIVE_PROBES = 3
UNACKED_TIMEOUT_MS = 5000  # data written (the request) and not acknowledged for this long


def _detect_dead_peers(sock: socket.socket | None) -> None:
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_KEEPIDLE"):  # Linux; other systems keep their defaults
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES)
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, UNACKED_TIMEOUT_MS)


class UpstreamError(ConnectionError):
    """The engine connection failed or closed before the answer was complete."""


class UpstreamTimeout(TimeoutError):
    """A deadline of the engine call passed (set by the caller's timer): the connection is not reused."""


class ClientGone(UpstreamError):
    """The proxy's own client hung up, so the engine call was aborted on purpose (never retried)."""


class UpstreamConnection(asyncio.Protocol):
    """One TCP connection to an engine, reading one response at a time."""

    def __init__(self, pool: UpstreamPool, key: tuple[str, int]) -> None:
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self.response: UpstreamResponse | None = None

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        _detect_dead_peers(transport.get_extra_info("socket"))

    def data_received(self, data: bytes) -> None:
        resp = self.response
        if resp is None:
            # Bytes nobody asked for: the connection is out of step, do not reuse it.
            self.close()
            return
        try:
            resp.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            resp.fail(UpstreamError(f"bad HTTP from engine: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.response is not None and not self.response.complete:
            self.response.fail(UpstreamError("engine closed the connection"))

    def pause_writing(self) -> None:  # pragma: no cover - request bodies are small
        pass

    def resume_writing(self) -> None:  # pragma: no cover
        pass

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class UpstreamResponse:
    """A response being read: status once headers arrive, then body chunks as they come."""

    def __init__(self, conn: UpstreamConnection) -> None:
        self.conn = conn
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers_done = False
        self.keep_alive = False
        self.complete = False
        self.error: Exception | None = None
        self.got_bytes = False
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.paused = False
        self._waiter: asyncio.Future[None] | None = None

    # -- httptools callbacks -----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.got_bytes = True

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        # Read now: httptools answers False once the message is complete.
        self.keep_alive = self.parser.should_keep_alive()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused and self.conn.transport is not None:
            self.paused = True
            self.conn.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    # -- consumer side -----------------------------------------------------------------------------

    def fail(self, exc: Exception) -> None:
        self.error = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def wait_headers(self) -> None:
        while not self.headers_done:
            if self.error is not None:
                raise self.error
            await self._wait()

    def read_nowait(self) -> bytes | None:
        """Body bytes already received, b"" once the body is complete, None when a wait is needed.

        Lets the caller skip a timeout and an await when the engine's answer is already in (the
        usual case for short answers: headers and body arrive in one segment).
        """
        if self.chunks:
            return self._take()
        if self.complete:
            return b""
        if self.error is not None:
            raise self.error
        return None

    async def readany(self) -> bytes:
        """The next body bytes, or b"" once the body is complete."""
        while not self.chunks:
            if self.complete:
                return b""
            if self.error is not None:
                raise self.error
            await self._wait()
        return self._take()

    def _take(self) -> bytes:
        data = self.chunks.popleft() if len(self.chunks) == 1 else b"".join(self._drain())
        self.buffered -= len(data)
        if self.paused and self.buffered < HIGH_WATER // 2 and self.conn.transport is not None:
            self.paused = False
            self.conn.transport.resume_reading()
        return data

    def _drain(self) -> list[bytes]:
        out = list(self.chunks)
        self.chunks.clear()
        return out

    async def read(self) -> bytes:
        parts: list[bytes] = []
        while True:
            chunk = await self.readany()
            if not chunk:
                return parts[0] if len(parts) == 1 else b"".join(parts)
            parts.append(chunk)

    def release(self) -> None:
        """Give the connection back for reuse when the answer was read whole; otherwise close it."""
        conn = self.conn
        conn.response = None
        if self.complete and self.error is None and not conn.closed and self.keep_alive:
            self.conn.pool.put(conn)
        else:
            conn.close()


class UpstreamPool:
    """Idle keep-alive connections per engine (host, port)."""

    def __init__(self) -> None:
        self.idle: dict[tuple[str, int], list[UpstreamConnection]] = {}

    def put(self, conn: UpstreamConnection) -> None:
        idle = self.idle.setdefault(conn.key, [])
        if len(idle) < MAX_IDLE_PER_ENDPOINT:
            conn.reused = True
            idle.append(conn)
        else:
            conn.close()

    async def _connect(self, host: str, port: int, timeout: float) -> UpstreamConnection:
        key = (host, port)
        idle = self.idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, proto = await loop.create_connection(lambda: UpstreamConnection(self, key), host, port)
        except TimeoutError:
            raise UpstreamError(f"connect to {host}:{port} timed out") from None
        return proto

    async def post(
        self,
        host: str,
        port: int,
        path: str,
        body: bytes,
        extra_headers: bytes,
        connect_timeout: float,
        on_response: Callable[[UpstreamResponse], None] | None = None,
    ) -> UpstreamResponse:
        """Send a JSON POST and return once the response headers are in.

        `on_response` is called with each response object as soon as its request is written, so that
        a caller can abort it (`fail` + close) while the engine still holds the request.
        """
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n"
        ).encode()
        for attempt in (0, 1):
            conn = await self._connect(host, port, connect_timeout)
            resp = UpstreamResponse(conn)
            conn.response = resp
            assert conn.transport is not None
            conn.transport.write(head + extra_headers + b"\r\n" + body)
            if on_response is not None:
                on_response(resp)
            try:
                await resp.wait_headers()
                return resp
            except UpstreamError:
                conn.close()
                # A pooled connection the engine had already closed: nothing was processed, try a new one
                # (not when the caller aborted it because its own client left).
                aborted = isinstance(resp.error, ClientGone)
                if attempt == 0 and conn.reused and not resp.got_bytes and not aborted:
                    continue
                raise
            except BaseException:  # cancelled (timeout): the answer may still come, so never reuse it
                conn.close()
                raise
        raise UpstreamError("unreachable")  # pragma: no cover

    def close(self) -> None:
        for conns in self.idle.values():
            for conn in conns:
                conn.close()
        self.idle.clear()


def split_base_url(base_url: str) -> tuple[str, int]:
    """("host", port) of an http:// base URL."""
    rest = base_url.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = rest.rpartition(":")
    if not host:
        return rest, 80
    return host.strip("[]"), int(port)


__all__: list[Any] = [
    "ClientGone",
    "UpstreamError",
    "UpstreamPool",
    "UpstreamResponse",
    "UpstreamTimeout",
    "split_base_url",
]
