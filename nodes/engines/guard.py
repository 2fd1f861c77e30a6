"""The engine port's gate: every request must carry the deployment's engine key, on every path.

vLLM's own `--api-key` guards only `/v1`, `/v2`, `/inference` and `/cohere` (tests/data/vllm/
endpoints.md, "API key"): `/invocations` runs chat and completions, `/tokenize` and `/detokenize`
answer anyone, and so do the dev and profiling endpoints. This pure-ASGI middleware, loaded into the
engine with vLLM's own `--middleware nodes.engines.guard.EngineKeyGuard` flag, refuses every request
without the key before any route runs. It reads the key from `VLLM_API_KEY`, the variable vLLM itself
reads (the key is never on the command line). `GET /health` stays open: it says only whether the
process serves, and liveness probes (the agent's, a load balancer's) need it without a secret.

Why here rather than a relay or TLS: it costs one header comparison per request and nothing per
token (+0.07 us/token on 2.46, within noise), where an authenticating relay re-sends every streamed
chunk through one more process (+3.46 us/token) and mutual TLS encrypts every chunk (+1.79 us/token
on the engine's side alone), measured in benchmarks/engine_guard.py (docs/benchmarks.md).

Stdlib only: it is imported by the engine's interpreter, which has vLLM but not necessarily Django.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

KEY_ENV = "VLLM_API_KEY"
IMPORT_PATH = "nodes.engines.guard.EngineKeyGuard"
OPEN_PATHS = frozenset({"/health"})
# vLLM's own 401 body (middleware/authenticate.py:59-61), so the proxy reads a refusal the same way.
UNAUTHORIZED_BODY = b'{"error":"Unauthorized"}'


def key_digests(raw: str | None) -> list[bytes]:
    """SHA-256 of each configured key (vLLM accepts several, space-separated in --api-key)."""
    return [hashlib.sha256(k.encode()).digest() for k in (raw or "").split() if k]


def authorized(authorization: bytes | None, digests: list[bytes]) -> bool:
    """Whether an `Authorization` header value carries one of the keys (constant time per key)."""
    if not authorization or not digests:
        return False
    scheme, _, token = authorization.partition(b" ")
    if scheme.lower() != b"bearer":
        return False
    digest = hashlib.sha256(token.strip()).digest()
    ok = False
    for d in digests:
        ok |= hmac.compare_digest(digest, d)
    return ok


def is_open(method: str, path: str) -> bool:
    return method in ("GET", "HEAD") and path in OPEN_PATHS


class EngineKeyGuard:
    """ASGI middleware: 401 for any HTTP request, and close for any WebSocket, without the engine key.

    With no key in the environment it refuses everything but /health (fail closed: a guard that was
    asked for but has nothing to check against must not let traffic through).
    """

    def __init__(self, app: ASGIApp, keys: str | None = None) -> None:
        self.app = app
        self.digests = key_digests(keys if keys is not None else os.environ.get(KEY_ENV))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope.get("type")
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :] or "/"
        header = None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                header = value
                break
        if (kind == "http" and is_open(scope.get("method", ""), path)) or authorized(header, self.digests):
            await self.app(scope, receive, send)
            return
        if kind == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(UNAUTHORIZED_BODY)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": UNAUTHORIZED_BODY})
