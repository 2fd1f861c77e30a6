"""A real HTTP model store on loopback (aiohttp), and small real model files to put in it.

`/store/...` is aiohttp's own static file handler (it answers Range requests); `/flaky/...` serves the
same files but cuts the connection after `cut_after` bytes for the first `cuts` requests of each file;
`/norange/...` ignores Range headers.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from nodes.agent.modelstore import WantedFile


@dataclass
class StoreServer:
    root: Path
    port: int = 0
    cuts: int = 0
    cut_after: int = 0
    ranges: list[str] = field(default_factory=list)  # the Range header of every /flaky/ request
    served: dict[str, int] = field(default_factory=dict)

    def url(self, prefix: str = "store") -> str:
        return f"http://127.0.0.1:{self.port}/{prefix}"


def _app(server: StoreServer) -> web.Application:
    async def flaky(request: web.Request) -> web.StreamResponse:
        tail = request.match_info["tail"]
        data = (server.root / tail).read_bytes()
        header = request.headers.get("Range", "")
        server.ranges.append(header)
        start = int(header.removeprefix("bytes=").rstrip("-")) if header else 0
        body = data[start:]
        headers = {"Content-Length": str(len(body))}
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        response = web.StreamResponse(status=206 if start else 200, headers=headers)
        await response.prepare(request)
        count = server.served.get(tail, 0)
        server.served[tail] = count + 1
        if count < server.cuts and server.cut_after < len(body):
            # Half a body, then the socket goes away: what a dropped link looks like to the client.
            # Only a body longer than `cut_after` is cut: aborting after a small file's whole body let
            # the RST race the client's read, so whether that file "resumed" depended on timing.
            await response.write(body[: server.cut_after])
            assert request.transport is not None
            request.transport.abort()
            return response
        await response.write(body)
        await response.write_eof()
        return response

    async def no_range(request: web.Request) -> web.StreamResponse:
        # A server that ignores Range: always the whole file, 200.
        return web.Response(body=(server.root / request.match_info["tail"]).read_bytes())

    app = web.Application()
    app.router.add_static("/store", server.root)
    app.router.add_get("/norange/{tail:.*}", no_range)
    app.router.add_get("/flaky/{tail:.*}", flaky)
    return app


@contextlib.contextmanager
def serve_store(root: Path) -> Iterator[StoreServer]:
    """A StoreServer over `root` on a free loopback port, in its own thread, for the block's duration."""
    server = StoreServer(root=root)
    root.mkdir(exist_ok=True)
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    runner = web.AppRunner(_app(server), access_log=None, shutdown_timeout=1.0)

    async def start() -> None:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        server.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()))
    thread.start()
    ready.wait(10)
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture
def store_server(tmp_path: Path) -> Iterator[StoreServer]:
    with serve_store(tmp_path / "store") as server:
        yield server


@dataclass
class Version:
    digest: str
    files: list[WantedFile]
    contents: dict[str, bytes]

    @property
    def total(self) -> int:
        return sum(f.size for f in self.files)


def make_version(store_root: Path, seed: str, sizes: dict[str, int]) -> Version:
    """Files of pseudo-random bytes in `<store_root>/<digest>/`, with their manifest lines."""
    contents = {}
    for path, size in sizes.items():
        chunk = hashlib.sha256(f"{seed}/{path}".encode()).digest()
        contents[path] = (chunk * (size // len(chunk) + 1))[:size]
        if size > 64:
            # Not periodic everywhere: a misplaced range would still be caught by content, not just size.
            contents[path] = contents[path][:-64] + os.urandom(64)
    files = [WantedFile(p, len(b), hashlib.sha256(b).hexdigest()) for p, b in sorted(contents.items())]
    digest = hashlib.sha256("".join(f"{f.sha256} {f.size} {f.path}\n" for f in files).encode()).hexdigest()
    for path, data in contents.items():
        target = store_root / digest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return Version(digest, files, contents)


@pytest.fixture
def version(store_server: StoreServer) -> Version:
    return make_version(
        store_server.root,
        "llama",
        {"config.json": 300, "model-00001-of-00002.safetensors": 700_000, "sub/tokenizer.json": 5_000},
    )
