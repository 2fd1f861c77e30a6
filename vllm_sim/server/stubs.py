"""Endpoints vLLM registers for generate models that the simulator has nothing behind: POST
/generative_scoring (501), POST /scale_elastic_ep (refused) and GET /is_scaling_elastic_ep (never)."""

from __future__ import annotations

from aiohttp import web

from vllm_sim.protocol import ApiError
from vllm_sim.server.state import ServerState, _json


class StubRoutes(ServerState):
    async def generative_scoring(self, request: web.Request) -> web.Response:
        # generative_scoring/api_router.py:29-30: served, unguarded; the simulator has no scores to give.
        await self._body(request)
        raise ApiError(501, "NotImplementedError", "The simulator does not implement generative scoring.")

    async def scale_elastic_ep(self, request: web.Request) -> web.Response:
        # elastic_ep/api_router.py:29: an engine without elastic expert parallelism refuses to scale.
        await self._body(request)
        raise ApiError(400, "BadRequestError", "Elastic expert parallelism is not enabled on this engine.")

    async def is_scaling_elastic_ep(self, request: web.Request) -> web.Response:
        return _json({"is_scaling_elastic_ep": False})
