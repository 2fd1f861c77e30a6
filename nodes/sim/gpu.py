"""The modelled GPU(s) behind a simulated engine, served on GET /sim/gpu (outside vLLM's API surface).

- memory: vLLM allocates its whole KV cache at start-up, so the used memory is weights + activation
  reserve + non-torch memory + KV cache from the moment the engine is up, whatever the load.
- utilization_pct: what nvidia-smi's GPU-Util means: the share of the last second in which a kernel
  (here: an engine step) was running.
- power: idle power, plus the dynamic range scaled by that busy share and by the step's arithmetic
  intensity (batch occupancy: tokens per step relative to the compute knee), since a memory-bound
  decode step at batch 1 draws far less than a compute-bound prefill.
- temperature: steady state, linear in power (no thermal lag modelled).
"""

from __future__ import annotations

import uuid
from typing import Any

from nodes.sim.engine import SimEngine
from nodes.sim.profiles import knee_tokens


def gpu_snapshot(engine: SimEngine, *, first_index: int, uuid_seed: str, ready: bool) -> dict[str, Any]:
    """The JSON body of /sim/gpu: one entry per rank (tensor x pipeline parallel)."""
    shape = engine.shape
    gpu = shape.profile.gpu
    now = engine.clock()
    busy = engine.busy_fraction(now)
    steps = [s for s in engine.recent_steps if s[0] >= now - 1.0]
    knee = knee_tokens(shape)
    if steps:
        weighted = sum(d * min(1.0, tok / knee) for _, d, tok in steps)
        total = sum(d for _, d, _ in steps)
        intensity = weighted / total if total else 0.0
    else:
        intensity = 0.0
    dynamic = gpu.power_max_watts - gpu.power_idle_watts
    power = gpu.power_idle_watts + dynamic * busy * (0.45 + 0.55 * intensity)
    temperature = 32.0 + 45.0 * (power - gpu.power_idle_watts) / dynamic
    used = shape.memory_used_bytes_per_gpu if ready else shape.weight_bytes_per_gpu
    gpus = []
    for rank in range(shape.world_size):
        index = first_index + rank
        gpus.append(
            {
                "index": index,
                "uuid": "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_OID, f"inferchain-sim:{uuid_seed}:{index}")),
                "name": gpu.name,
                "memory_total_bytes": gpu.memory_bytes,
                "memory_used_bytes": used,
                "utilization_pct": round(100.0 * busy, 1),
                "power_watts": round(power, 1),
                "power_limit_watts": gpu.power_max_watts,
                "temperature_c": round(temperature, 1),
                "batch_occupancy": round(len(engine.running) / shape.max_num_seqs, 4),
                "kv_cache_usage": round(engine.kv_cache_usage, 4),
            }
        )
    return {"simulated": True, "profile": shape.profile.name, "gpus": gpus}
