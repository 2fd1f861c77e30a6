"""The proxy's engine client: keep-alive reuse, chunked SSE, and a stale pooled connection replaced."""

from __future__ import annotations

import asyncio

from routing.proxy.upstream import UpstreamPool, split_base_url

BODY = b'{"ok":true}'


async def _server(close_after_each: bool, chunked: bool = False) -> tuple[asyncio.Server, int, list[int]]:
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(
                next(
                    line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
                ).split(b":")[1]
            )
            await reader.readexactly(length)
            if chunked:
                events = [b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"]
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
                writer.write(b"transfer-encoding: chunked\r\n\r\n")
                for ev in events:
                    writer.write(f"{len(ev):x}\r\n".encode() + ev + b"\r\n")
                    await writer.drain()
                writer.write(b"0\r\n\r\n")
            else:
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(BODY), BODY))
            await writer.drain()
            if close_after_each:
                # Like an engine whose idle timeout fired: the client still holds this connection.
                writer.close()
                return

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], connections


async def test_keep_alive_reuses_one_connection() -> None:
    server, port, connections = await _server(close_after_each=False)
    pool = UpstreamPool()
    for _ in range(5):
        resp = await pool.post("127.0.0.1", port, "/v1/x", b"{}", b"", 1.0)
        assert resp.status == 200 and await resp.read() == BODY
        resp.release()
    assert len(connections) == 1
    pool.close()
    server.close()


async def test_stale_pooled_connection_is_replaced_transparently() -> None:
    server, port, connections = await _server(close_after_each=True)
    pool = UpstreamPool()
    for _ in range(3):
        resp = await pool.post("127.0.0.1", port, "/v1/x", b"{}", b"", 1.0)
        assert await resp.read() == BODY
        resp.release()
        await asyncio.sleep(0.05)  # let the close arrive, or not: both must work
    assert len(connections) == 3
    pool.close()
    server.close()


async def test_chunked_sse_is_dechunked() -> None:
    server, port, _ = await _server(close_after_each=False, chunked=True)
    pool = UpstreamPool()
    resp = await pool.post("127.0.0.1", port, "/v1/x", b"{}", b"", 1.0)
    assert await resp.read() == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
    resp.release()
    pool.close()
    server.close()


def test_split_base_url() -> None:
    assert split_base_url("http://10.0.0.5:8000") == ("10.0.0.5", 8000)
    assert split_base_url("http://[::1]:9000/") == ("::1", 9000)
    assert split_base_url("http://engine") == ("engine", 80)
