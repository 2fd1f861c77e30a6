"""The standalone proxy's HTTP/1.1 server (routing/proxy/server.py), on raw sockets.

In-process tests run a small ASGI app under `serve_socket` and speak HTTP by hand, so that framing,
keep-alive, pipelining, limits and disconnects are checked byte for byte. The process tests run the real
`python -m routing.proxy` for workers and the graceful stop. Every proxy test in tests/routing also goes
through this server, since the proxy fixture starts `python -m routing.proxy`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httptools
import pytest
from django.db import connection

from routing.proxy.server import bind, serve_socket

from .conftest import free_port, proxy_env, wait_http

MAX_BODY = 1000


class App:
    """Echoes the request; `/stream` answers in three body messages; `/wait` holds until released."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.paths: list[str] = []
        self.release = asyncio.Event()
        self.disconnected = asyncio.Event()
        self.started = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                self.events.append(message["type"])
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        message = await receive()
        body = message["body"]
        path = scope["path"]
        self.paths.append(path)
        if path == "/stream":
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
            )
            for part in (b"one,", b"two,", b"three"):
                await send({"type": "http.response.body", "body": part, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        if path == "/wait":
            self.started.set()

            async def watch() -> None:
                if (await receive())["type"] == "http.disconnect":
                    self.disconnected.set()

            watcher = asyncio.ensure_future(watch())
            await self.release.wait()
            watcher.cancel()
        if path == "/crash":
            raise RuntimeError("boom")
        payload = json.dumps(
            {
                "method": scope["method"],
                "path": path,
                "query": scope["query_string"].decode(),
                "body": body.decode(),
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": payload})


@pytest.fixture
async def server() -> AsyncIterator[tuple[int, App]]:
    app = App()
    sock = bind("127.0.0.1", 0)
    stop = asyncio.Event()
    task = asyncio.ensure_future(serve_socket(sock, app, MAX_BODY, stop))
    for _ in range(100):
        if "lifespan.startup" in app.events:
            break
        await asyncio.sleep(0.01)
    yield sock.getsockname()[1], app
    stop.set()
    await asyncio.wait_for(task, 10)
    assert app.events == ["lifespan.startup", "lifespan.shutdown"]


class Conn:
    """A raw client connection that reads responses with httptools."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.responses: list[dict[str, Any]] = []
        self._cur: dict[str, Any] = {}
        self.parser = httptools.HttpResponseParser(self)

    def on_message_begin(self) -> None:
        self._cur = {"headers": {}, "body": b"", "chunks": 0}

    def on_header(self, name: bytes, value: bytes) -> None:
        self._cur["headers"][name.decode().lower()] = value.decode()

    def on_headers_complete(self) -> None:
        self._cur["status"] = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self._cur["body"] += body

    def on_chunk_header(self) -> None:
        self._cur["chunks"] += 1

    def on_message_complete(self) -> None:
        self.responses.append(self._cur)

    async def read(self, count: int = 1, timeout: float = 5.0) -> list[dict[str, Any]]:
        async with asyncio.timeout(timeout):
            while len(self.responses) < count:
                data = await self.reader.read(65536)
                if not data:
                    break
                self.parser.feed_data(data)
        got, self.responses = self.responses[:count], self.responses[count:]
        return got

    async def closed(self, timeout: float = 5.0) -> bool:
        async with asyncio.timeout(timeout):
            return await self.reader.read(1) == b""


async def connect(port: int) -> Conn:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    return Conn(reader, writer)


def post(path: str, body: bytes, extra: bytes = b"", version: bytes = b"1.1") -> bytes:
    return b"POST %s HTTP/%s\r\nhost: x\r\ncontent-length: %d\r\n%s\r\n%s" % (
        path.encode(),
        version,
        len(body),
        extra,
        body,
    )


async def test_keep_alive_answers_several_requests_on_one_connection(server: tuple[int, App]) -> None:
    port, _ = server
    conn = await connect(port)
    for n in range(3):
        conn.writer.write(post(f"/echo?n={n}", b"hello %d" % n))
        (resp,) = await conn.read()
        assert resp["status"] == 200
        assert resp["headers"]["content-length"] == str(len(resp["body"]))
        assert json.loads(resp["body"]) == {
            "method": "POST",
            "path": "/echo",
            "query": f"n={n}",
            "body": f"hello {n}",
        }
        assert "connection" not in resp["headers"]


async def test_pipelined_requests_are_answered_in_order(server: tuple[int, App]) -> None:
    port, _ = server
    conn = await connect(port)
    conn.writer.write(b"".join(post(f"/p{n}", b"%d" % n) for n in range(5)))
    responses = await conn.read(5)
    assert [json.loads(r["body"])["path"] for r in responses] == [f"/p{n}" for n in range(5)]


async def test_streamed_response_is_chunked_and_whole_one_has_a_length(server: tuple[int, App]) -> None:
    port, _ = server
    conn = await connect(port)
    conn.writer.write(post("/stream", b""))
    (resp,) = await conn.read()
    assert resp["headers"]["transfer-encoding"] == "chunked"
    assert "content-length" not in resp["headers"]
    assert resp["body"] == b"one,two,three" and resp["chunks"] >= 3
    conn.writer.write(post("/echo", b"after the stream"))
    (resp,) = await conn.read()
    assert json.loads(resp["body"])["body"] == "after the stream"


async def test_http10_closes_unless_keep_alive_is_asked(server: tuple[int, App]) -> None:
    port, _ = server
    conn = await connect(port)
    conn.writer.write(post("/a", b"x", version=b"1.0"))
    (resp,) = await conn.read()
    assert resp["status"] == 200 and resp["headers"]["connection"] == "close"
    assert await conn.closed()
    conn = await connect(port)
    conn.writer.write(post("/a", b"x", b"connection: keep-alive\r\n", version=b"1.0"))
    (resp,) = await conn.read()
    assert resp["headers"]["connection"] == "keep-alive"
    conn.writer.write(post("/b", b"y", b"connection: keep-alive\r\n", version=b"1.0"))
    (resp,) = await conn.read()
    assert json.loads(resp["body"])["path"] == "/b"


async def test_connection_close_from_client_is_honoured(server: tuple[int, App]) -> None:
    port, _ = server
    conn = await connect(port)
    conn.writer.write(post("/a", b"x", b"connection: close\r\n"))
    (resp,) = await conn.read()
    assert resp["status"] == 200 and resp["headers"]["connection"] == "close"
    assert await conn.closed()


async def test_expect_continue_gets_100_then_the_answer(server: tuple[int, App]) -> None:
    port, _ = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /e HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\nexpect: 100-continue\r\n\r\n")
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"body")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")


async def test_body_over_the_limit_by_length_is_refused_before_it_is_sent(server: tuple[int, App]) -> None:
    port, _ = server
    conn = await connect(port)
    conn.writer.write(b"POST /big HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % (MAX_BODY + 1))
    (resp,) = await conn.read()
    assert resp["status"] == 413
    error = json.loads(resp["body"])["error"]
    assert error["code"] == "body_too_large" and str(MAX_BODY) in error["message"]
    assert await conn.closed()


async def test_nothing_after_a_refused_request_is_served(server: tuple[int, App]) -> None:
    port, app = server
    conn = await connect(port)
    # A whole message whose chunked body runs over the limit, then another request in the same write.
    chunks = b"".join(b"%x\r\n%s\r\n" % (400, b"a" * 400) for _ in range(3)) + b"0\r\n\r\n"
    refused = b"POST /big HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n" + chunks
    conn.writer.write(refused + post("/smuggled", b"x"))
    responses = await conn.read(2)
    assert [r["status"] for r in responses] == [413]
    await asyncio.sleep(0.1)
    assert "/smuggled" not in app.paths  # never handed to the app


async def test_chunked_body_over_the_limit_is_refused_while_reading(server: tuple[int, App]) -> None:
    port, _ = server
    conn = await connect(port)
    conn.writer.write(b"POST /big HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
    for _ in range(3):
        conn.writer.write(b"%x\r\n%s\r\n" % (400, b"a" * 400))
    (resp,) = await conn.read()
    assert resp["status"] == 413 and json.loads(resp["body"])["error"]["code"] == "body_too_large"


async def test_chunked_body_within_the_limit_reaches_the_app_whole(server: tuple[int, App]) -> None:
    port, _ = server
    conn = await connect(port)
    conn.writer.write(b"POST /c HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
    conn.writer.write(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
    (resp,) = await conn.read()
    assert json.loads(resp["body"])["body"] == "abcde"


async def test_oversized_head_gets_431_and_malformed_request_400(server: tuple[int, App]) -> None:
    port, _ = server
    conn = await connect(port)
    conn.writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 70_000 + b"\r\n\r\n")
    (resp,) = await conn.read()
    assert resp["status"] == 431
    assert await conn.closed()
    conn = await connect(port)
    conn.writer.write(b"THIS IS NOT HTTP\r\n\r\n")
    (resp,) = await conn.read()
    assert resp["status"] == 400 and json.loads(resp["body"])["error"]["message"] == "Malformed HTTP request."


async def test_client_hang_up_reaches_the_app_as_disconnect(server: tuple[int, App]) -> None:
    port, app = server
    conn = await connect(port)
    conn.writer.write(post("/wait", b""))
    await asyncio.wait_for(app.started.wait(), 5)
    conn.writer.close()
    await asyncio.wait_for(app.disconnected.wait(), 5)
    app.release.set()


async def test_app_failure_gets_500_and_the_server_keeps_serving(server: tuple[int, App]) -> None:
    port, _ = server
    conn = await connect(port)
    conn.writer.write(post("/crash", b""))
    (resp,) = await conn.read()
    assert resp["status"] == 500 and json.loads(resp["body"])["error"]["code"] == "internal_error"
    conn = await connect(port)
    conn.writer.write(post("/fine", b""))
    (resp,) = await conn.read()
    assert resp["status"] == 200


async def test_stop_lets_the_request_in_flight_finish() -> None:
    app = App()
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    stop = asyncio.Event()
    task = asyncio.ensure_future(serve_socket(sock, app, MAX_BODY, stop))
    while "lifespan.startup" not in app.events:
        await asyncio.sleep(0.01)
    busy = await connect(port)
    busy.writer.write(post("/wait", b"in flight"))
    idle = await connect(port)
    idle.writer.write(post("/quick", b""))
    await idle.read()
    await asyncio.wait_for(app.started.wait(), 5)
    stop.set()
    assert await idle.closed()  # idle keep-alive connections close at once
    await asyncio.sleep(0.2)
    assert not task.done()  # the busy one holds the stop
    app.release.set()
    (resp,) = await busy.read()
    assert resp["status"] == 200 and resp["headers"]["connection"] == "close"
    assert json.loads(resp["body"])["body"] == "in flight"
    await asyncio.wait_for(task, 10)
    assert app.events[-1] == "lifespan.shutdown"
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)


# ---- the real process ------------------------------------------------------------------------------


def _children(pid: int) -> set[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return {int(p) for p in path.read_text().split()} if path.exists() else set()


def test_workers_share_the_port_and_a_dead_worker_is_replaced(transactional_db: None, tmp_path: Path) -> None:
    connection.ensure_connection()  # the workers must see the test database
    port = free_port()
    log_path = tmp_path / "proxy.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "routing.proxy", "--port", str(port), "--workers", "2", "--log-level", "info"],
        env=proxy_env(),
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", proc, log_path)
        deadline = time.monotonic() + 30
        while len(_children(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        workers = _children(proc.pid)
        assert len(workers) == 2
        victim = sorted(workers)[0]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            now = _children(proc.pid)
            if len(now) == 2 and victim not in now:
                break
            time.sleep(0.1)
        assert len(_children(proc.pid)) == 2 and victim not in _children(proc.pid)
        wait_http(f"http://127.0.0.1:{port}/healthz", proc, log_path)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert not any(Path(f"/proc/{pid}").exists() for pid in workers - {victim})
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(10)


def test_zero_workers_is_refused() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "routing.proxy", "--workers", "0"], capture_output=True, timeout=30
    )
    assert out.returncode == 2 and b"--workers must be at least 1" in out.stderr
