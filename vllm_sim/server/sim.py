"""The simulator's own endpoints, which vLLM does not have: GET /sim/gpu (the modelled GPUs, for the
node agent), GET /sim/stats (the engine cores' counters, for tests) and POST /sim/slowdown (make the
modelled hardware slower or faster while it runs, for tests of what learns an engine's speed)."""

from __future__ import annotations

import math
from typing import Any

from aiohttp import web

from vllm_sim.gpu import gpu_snapshot
from vllm_sim.server.state import ServerState, _json


class SimRoutes(ServerState):
    async def sim_gpu(self, request: web.Request) -> web.Response:
        seed = self.args.sim_gpu_uuid_seed or str(self.args.port)
        # Data-parallel rank i runs on GPUs first + i*W .. first + (i+1)*W - 1, W = TP x PP.
        world = self.shape.world_size
        gpus: list[dict[str, Any]] = []
        for i, e in enumerate(self.engines):
            first = self.args.sim_gpu_index + i * world
            gpus.extend(
                gpu_snapshot(
                    e,
                    first_index=first,
                    uuid_seed=seed,
                    ready=self.ready,
                    sleep_mode=bool(self.args.enable_sleep_mode),
                )["gpus"]
            )
        return _json({"simulated": True, "profile": self.shape.profile.name, "gpus": gpus})

    async def sim_stats(self, request: web.Request) -> web.Response:
        es = self.engines
        return _json(
            {
                "simulated": True,
                "profile": self.shape.profile.name,
                "time_scale": self.engine.time_scale,
                "slowdown": self.engine.slowdown,
                "data_parallel_size": len(es),
                # Per engine core; the totals below add them up.
                "num_gpu_blocks": self.shape.num_gpu_blocks,
                "block_size": self.shape.block_size,
                "free_blocks": sum(e.pool.num_free for e in es),
                "max_num_seqs": self.shape.max_num_seqs,
                "max_num_batched_tokens": self.shape.max_num_batched_tokens,
                "max_model_len": self.shape.max_model_len,
                "running": sum(len(e.running) for e in es),
                "waiting": sum(len(e.waiting) for e in es),
                "running_per_engine": [len(e.running) for e in es],
                "steps": sum(e.total_steps for e in es),
                "preemptions": sum(e.num_preemptions for e in es),
                "busy_model_s": round(sum(e.busy_model_s for e in es), 6),
                "lost_wall_s": round(max(e.lost_wall_s for e in es), 6),
                "requests": self.request_count,
                "hung": any(e.hung for e in es),
            }
        )

    async def sim_slowdown(self, request: web.Request) -> web.Response:
        # ?factor=2 makes every step take twice its modelled time from the next step on; 1 undoes it.
        try:
            factor = float(request.query.get("factor", "1"))
        except ValueError:
            factor = math.nan
        if not math.isfinite(factor) or factor <= 0:
            return _json({"error": "factor must be a positive number"}, 400)
        for e in self.engines:
            e.slowdown = factor
        return _json({"slowdown": factor})
