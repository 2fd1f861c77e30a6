"""The endpoints every vLLM server answers about itself: /health and /ping, /version, /load, /metrics,
/v1/models, and FastAPI's /openapi.json, /docs and /redoc (unless --disable-fastapi-docs)."""

from __future__ import annotations

import uuid
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from vllm_sim.server.state import ServerState, _json

VERSION = "0.28.0.dev0+sim"


class BasicRoutes(ServerState):
    async def health(self, request: web.Request) -> web.Response:
        # instrumentator/health.py:22-33: 503 once the engine core is dead (EngineDeadError).
        return web.Response(status=503 if any(e.dead for e in self.engines) else 200)

    async def version(self, request: web.Request) -> web.Response:
        return _json({"version": VERSION})

    async def load(self, request: web.Request) -> web.Response:
        # basic.py:30-50: the counter moves only with --enable-server-load-tracking; otherwise 0.
        return _json({"server_load": self.in_flight if self.load_tracking else 0})

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        for e in self.engines:
            e._update_gauges()
        return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def models(self, request: web.Request) -> web.Response:
        data = []
        for name in self.served_names:
            data.append(
                {
                    "id": name,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "vllm",
                    "root": self.args.model,
                    "parent": None,
                    "max_model_len": self.shape.max_model_len,
                    "permission": [
                        {
                            "id": f"modelperm-{uuid.uuid4().hex}",
                            "object": "model_permission",
                            "created": self.created,
                            "allow_create_engine": False,
                            "allow_sampling": True,
                            "allow_logprobs": True,
                            "allow_search_indices": False,
                            "allow_view": True,
                            "allow_fine_tuning": False,
                            "organization": "*",
                            "group": None,
                            "is_blocking": False,
                        }
                    ],
                }
            )
        return _json({"object": "list", "data": data})

    def _routes(self, request: web.Request) -> list[tuple[str, str]]:
        out = []
        for route in request.app.router.routes():
            info = route.resource.get_info() if route.resource is not None else {}
            path = info.get("path") or info.get("formatter")
            if path and not path.startswith("/sim/") and route.method != "HEAD":
                out.append((path, route.method.lower()))
        return out

    async def openapi(self, request: web.Request) -> web.Response:
        """FastAPI's /openapi.json, reduced to what a client discovers with it: the registered paths."""
        paths: dict[str, dict[str, Any]] = {}
        for path, method in self._routes(request):
            ok = {"responses": {"200": {"description": "Successful Response"}}}
            paths.setdefault(path, {})[method] = ok
        return _json({"openapi": "3.1.0", "info": {"title": "FastAPI", "version": "0.1.0"}, "paths": paths})

    async def docs_page(self, request: web.Request) -> web.Response:
        page = (
            "<!DOCTYPE html><html><head><title>FastAPI - Swagger UI</title></head><body>"
            '<div id="swagger-ui"></div><p>OpenAPI document: <a href="/openapi.json">/openapi.json</a></p>'
            "</body></html>"
        )
        return web.Response(text=page, content_type="text/html")
