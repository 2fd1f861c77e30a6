"""Writing a whole (non-streamed) answer or an OpenAI-shaped error to the ASGI `send`."""

from __future__ import annotations

from routing.proxy.errors import ProxyError
from routing.proxy.pipeline.context import RequestContext, Send

JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


async def send_raw(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, err: ProxyError, request_id: str | None = None) -> None:
    headers = [*JSON_HEADERS, *err.headers]
    if request_id:
        headers.append((b"x-request-id", request_id.encode()))
    await send_raw(send, err.status, err.body(), headers)


def response_headers(ctx: RequestContext, base: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """`base` plus the request id and the limit headers of the admission."""
    headers = [*base, (b"x-request-id", ctx.request_id.encode())]
    if ctx.admission is not None:
        headers.extend(ctx.admission.headers)
    if ctx.stage_run is not None:
        headers.extend(ctx.stage_run.headers)
    return headers
