"""The modelled GPU(s) behind a simulated engine, served on GET /sim/gpu (outside vLLM's API surface).

- memory: vLLM allocates its whole KV cache at start-up, so the used memory is weights + activation
  reserve + non-torch memory + KV cache from the moment the engine is up, whatever the load.
- utilization_pct: what nvidia-smi's GPU-Util means: the share of the last second in which a kernel
  (here: an engine step) was running.
- power: idle power, plus the dynamic range scaled by that busy share and by the step's arithmetic
  intensity (batch occupancy: tokens per step relative to the compute knee), since a memory-bound
  decode step at batch 1 draws far less than a compute-bound prefill.
- temperature: steady state, linear in power (no thermal lag modelled).
- sleep mode (--enable-sleep-mode and POST /sleep): the sleeping parts leave the GPU: level 1 and 2
  discard the KV cache, level 1 moves the weights to host memory (`offloaded_bytes`), level 2 drops
  them. What stays is the CUDA context, graphs and activation reserve. Without sleep mode nothing is
  freed (vLLM allocates from its sleep-capable pool only in sleep mode).
"""

from __future__ import annotations

import uuid
from typing import Any

from vllm_sim.engine import SimEngine
from vllm_sim.profiles import knee_tokens


def gpu_snapshot(
    engine: SimEngine, *, first_index: int, uuid_seed: str, ready: bool, sleep_mode: bool = False
) -> dict[str, Any]:
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
    offloaded = 0
    if ready and sleep_mode and engine.sleeping:
        if "weights" in engine.asleep:
            used -= shape.weight_bytes_per_gpu
            if engine.sleep_level == 1:
                offloaded = shape.weight_bytes_per_gpu
        if "kv_cache" in engine.asleep:
            used -= shape.kv_cache_bytes_per_gpu
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
                "sleep_level": engine.sleep_level if engine.sleeping else 0,
                "offloaded_bytes": offloaded,
            }
        )
    return {"simulated": True, "profile": shape.profile.name, "gpus": gpus}
