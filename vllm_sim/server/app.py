"""The server object and its route table: SimServer joins every endpoint family's handlers, registers
them as vLLM does (some only with a flag or VLLM_SERVER_DEV_MODE=1) and wraps them in vLLM's API-key
check and error bodies."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable

from aiohttp import web

from vllm_sim import asgi_filter
from vllm_sim.protocol import ApiError
from vllm_sim.server.basic import BasicRoutes
from vllm_sim.server.dev import DevRoutes
from vllm_sim.server.generation import GenerationRoutes
from vllm_sim.server.sim import SimRoutes
from vllm_sim.server.state import _error, _json
from vllm_sim.server.stubs import StubRoutes
from vllm_sim.server.tokenizer import TokenizerRoutes

GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class SimServer(BasicRoutes, TokenizerRoutes, GenerationRoutes, StubRoutes, DevRoutes, SimRoutes):
    """One simulated `vllm serve` process: configuration, engine, fault knobs and HTTP handlers."""

    def build_app(self) -> web.Application:
        # vLLM adds --middleware classes outside its own auth middleware, so they see every request first.
        extra = [asgi_filter.asgi_filter(asgi_filter.load(path)) for path in self.args.middleware or []]
        app = web.Application(
            middlewares=[*extra, self._errors_mw, self._auth_mw], client_max_size=64 * 1024**2
        )
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/ping", self.health)
        r.add_post("/ping", self.health)
        r.add_get("/version", self.version)
        r.add_get("/load", self.load)
        r.add_get("/metrics", self.metrics_endpoint)
        r.add_get("/v1/models", self.models)
        r.add_post("/tokenize", self.tokenize)
        r.add_post("/detokenize", self.detokenize)
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_post("/v1/chat/completions/batch", self.batch_chat_completions)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/responses", self.responses)
        # SageMaker's dispatcher (sagemaker/api_router.py:54-96): not under /v1, so never key-guarded.
        r.add_post("/invocations", self.invocations)
        # Also served by vLLM for generate models and not key-guarded (tests/data/vllm/endpoints.md).
        r.add_post("/generative_scoring", self.generative_scoring)
        r.add_post("/scale_elastic_ep", self.scale_elastic_ep)
        r.add_post("/is_scaling_elastic_ep", self.is_scaling_elastic_ep)
        if self.args.enable_tokenizer_info_endpoint:
            r.add_get("/tokenizer_info", self.tokenizer_info)
        if not self.args.disable_fastapi_docs:
            # FastAPI's defaults (launchers/app.py:34-41), dropped by --disable-fastapi-docs.
            r.add_get("/openapi.json", self.openapi)
            r.add_get("/docs", self.docs_page)
            r.add_get("/redoc", self.docs_page)
        if self.dev_mode:
            # routers.py:34-37: only with VLLM_SERVER_DEV_MODE=1; none of these are under /v1.
            r.add_post("/sleep", self.sleep)
            r.add_post("/wake_up", self.wake_up)
            r.add_get("/is_sleeping", self.is_sleeping)
            r.add_post("/reset_prefix_cache", self.reset_prefix_cache)
            r.add_get("/server_info", self.server_info)
        r.add_get("/sim/gpu", self.sim_gpu)
        r.add_get("/sim/stats", self.sim_stats)
        r.add_post("/sim/slowdown", self.sim_slowdown)
        return app

    @web.middleware
    async def _auth_mw(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        # vLLM's AuthenticationMiddleware: a path-prefix check, Bearer scheme case-insensitive,
        # keys compared by SHA-256 in constant time, compact {"error":"Unauthorized"} body.
        if self.api_keys and request.method != "OPTIONS" and request.path.startswith(GUARDED_PREFIXES):
            header = request.headers.get("Authorization", "")
            scheme, _, token = header.partition(" ")
            ok = False
            if scheme.lower() == "bearer":
                digest = hashlib.sha256(token.encode()).digest()
                for d in self._key_digests:
                    ok |= hmac.compare_digest(digest, d)
            if not ok:
                return web.Response(
                    body=b'{"error":"Unauthorized"}', status=401, content_type="application/json"
                )
        return await handler(request)

    @web.middleware
    async def _errors_mw(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as err:
            return _error(err)
        except web.HTTPNotFound:
            return _json({"detail": "Not Found"}, 404)
        except web.HTTPMethodNotAllowed:
            return _json({"detail": "Method Not Allowed"}, 405)
