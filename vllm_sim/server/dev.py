"""vLLM's dev endpoints, served only with VLLM_SERVER_DEV_MODE=1: POST /sleep, /wake_up and
/reset_prefix_cache, GET /is_sleeping and /server_info."""

from __future__ import annotations

import asyncio

from aiohttp import web

from vllm_sim.profiles import wake_time_s
from vllm_sim.server.state import ServerState, _json


class DevRoutes(ServerState):
    async def sleep(self, request: web.Request) -> web.Response:
        # dev/sleep/api_router.py:21-29: level (default "1") and mode (default "abort"); empty 200.
        # A level that is no integer fails in int() there: a 500, as here.
        level = int(request.query.get("level", "1"))
        mode = request.query.get("mode", "abort")
        for e in self.engines:
            e.sleep(level, abort=mode == "abort")
            e.metrics.set_sleep_state(level)
        return web.Response(status=200)

    async def wake_up(self, request: web.Request) -> web.Response:
        # sleep/api_router.py:32-42: repeated `tags`; none wakes everything. The answer comes once the
        # memory is back, after the modelled copy time (profiles.wake_time_s).
        tags = request.query.getall("tags", None)
        delay = 0.0
        for e in self.engines:
            if self.args.enable_sleep_mode:
                delay = max(delay, wake_time_s(e.shape, e.sleep_level, e.waking(tags)))
        if delay > 0:
            await asyncio.sleep(delay / self.args.sim_time_scale)
        for e in self.engines:
            e.wake_up(tags)
            if not e.sleeping:
                e.metrics.set_sleep_state(0)
        return web.Response(status=200)

    async def is_sleeping(self, request: web.Request) -> web.Response:
        return _json({"is_sleeping": self.engine.sleeping})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        for e in self.engines:
            e.pool.reset_cache()
        return web.Response(status=200)

    async def server_info(self, request: web.Request) -> web.Response:
        return _json({"vllm_config": {"model": self.args.model, "max_model_len": self.shape.max_model_len}})
