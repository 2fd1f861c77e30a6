"""vLLM's `--middleware` for the simulator: an ASGI middleware class run as a filter before its routes.

vLLM adds each `--middleware` class to its FastAPI app (`app.add_middleware`). The simulator is an
aiohttp app, so it runs the same class on an ASGI scope built from the request: if the middleware
calls through to the app, the request goes on to its aiohttp handler; if it answers (or closes) by
itself, that answer is the response. Enough for middleware that accepts or refuses a request, such
as nodes/engines/guard.py; one that rewrites bodies or responses is refused at start.
"""

from __future__ import annotations

import contextvars
import importlib
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_passed: contextvars.ContextVar[list[bool]] = contextvars.ContextVar("asgi_filter_passed")


def load(import_path: str) -> Any:
    """The object `import_path` names (`package.module.Name`), as vLLM resolves `--middleware`."""
    module_path, _, name = import_path.rpartition(".")
    if not module_path:
        raise SystemExit(f"--middleware {import_path!r}: expected an import path like package.module.Class")
    obj = getattr(importlib.import_module(module_path), name)
    if not inspect.isclass(obj):
        raise SystemExit(f"--middleware {import_path!r}: the simulator runs ASGI middleware classes only")
    return obj


async def _through(scope: Any, receive: Any, send: Any) -> None:
    _passed.get()[0] = True


def asgi_filter(middleware_class: Any) -> Any:
    """An aiohttp middleware that runs `middleware_class` (ASGI) as an accept-or-answer filter."""
    asgi = middleware_class(app=_through)

    @web.middleware
    async def run(request: web.Request, handler: Handler) -> web.StreamResponse:
        passed = [False]
        token = _passed.set(passed)
        status, headers, body = 500, [], bytearray()

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: Any) -> None:
            nonlocal status, headers
            if message["type"] == "http.response.start":
                status, headers = message["status"], message.get("headers", [])
            elif message["type"] == "http.response.body":
                body.extend(message.get("body", b""))
            elif message["type"] == "websocket.close":
                status = 403

        peer = request.transport.get_extra_info("peername") if request.transport else None
        scope = {
            "type": "websocket" if request.headers.get("Upgrade", "").lower() == "websocket" else "http",
            "method": request.method,
            "path": request.path,
            "raw_path": request.raw_path.encode(),
            "root_path": "",
            "query_string": request.query_string.encode(),
            "headers": [
                (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in request.headers.items()
            ],
            "client": tuple(peer[:2]) if isinstance(peer, tuple) else None,
        }
        try:
            await asgi(scope, receive, send)
        finally:
            _passed.reset(token)
        if passed[0]:
            return await handler(request)
        response = web.Response(body=bytes(body), status=status)
        for name, value in headers:
            if name.lower() != b"content-length":
                response.headers[name.decode("latin-1")] = value.decode("latin-1")
        return response

    return run
