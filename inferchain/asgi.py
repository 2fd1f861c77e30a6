"""The one ASGI app: `/v1/` goes to the lean proxy, `/ws/` to Channels, everything else to Django."""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inferchain.settings")

from django.core.asgi import get_asgi_application

django_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.urls import path  # noqa: E402

from core.consumers import LiveConsumer  # noqa: E402
from nodes.agent_ingest import SYNC_PATH, AgentIngest  # noqa: E402
from routing.proxy.app import build_proxy_app  # noqa: E402

proxy_app = build_proxy_app()
# Agents' routine syncs are answered in the event loop; the rest reach Django's view with their body.
agent_ingest = AgentIngest(django_app)


async def http_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    # The data plane skips Django entirely: no middleware, no ORM on the hot path.
    if scope["path"].startswith("/v1/") or scope["path"] == "/v1":
        await proxy_app(scope, receive, send)
    elif scope["path"] == SYNC_PATH and scope["method"] == "POST":
        await agent_ingest(scope, receive, send)
    else:
        await django_app(scope, receive, send)


application = ProtocolTypeRouter(
    {
        "http": http_app,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter([path("ws/live/", LiveConsumer.as_asgi())]))
        ),
        "lifespan": proxy_app,
    }
)
