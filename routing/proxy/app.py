"""The `/v1/` data plane. Built out by the proxy issue; until then it answers in OpenAI's error shape."""

from __future__ import annotations

import json
from typing import Any


def build_proxy_app() -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = json.dumps(
            {
                "error": {
                    "message": "No route for this path.",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "not_found",
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 404,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return app
