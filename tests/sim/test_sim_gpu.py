"""GET /sim/gpu: the modelled GPU, clearly marked as simulated, outside vLLM's surface."""

from __future__ import annotations

import threading
import time

from tests.sim.conftest import MODEL, SimFactory
from tests.sim.http import call, call_json
from vllm_sim.testing import SimHandle

FIELDS = {
    "index",
    "uuid",
    "name",
    "memory_total_bytes",
    "memory_used_bytes",
    "utilization_pct",
    "power_watts",
    "temperature_c",
}


def test_shape_and_static_values(sim: SimHandle) -> None:
    status, body = call_json(sim.base_url + "/sim/gpu")
    assert status == 200 and body["simulated"] is True
    (gpu,) = body["gpus"]
    assert set(gpu) >= FIELDS
    assert gpu["name"] == "NVIDIA H100 80GB HBM3"
    assert gpu["uuid"].startswith("GPU-")
    # vLLM pre-allocates its KV cache: about gpu_memory_utilization of the memory is in use at idle.
    assert 0.85 < gpu["memory_used_bytes"] / gpu["memory_total_bytes"] <= 0.92


def test_idle_gpu_draws_idle_power(sim_factory: SimFactory) -> None:
    sim = sim_factory("--max-model-len", "4096", "--sim-gpu-index", "3")
    _, body = call_json(sim.base_url + "/sim/gpu")
    gpu = body["gpus"][0]
    assert gpu["index"] == 3
    assert gpu["utilization_pct"] == 0.0
    assert gpu["power_watts"] == 70.0


def test_utilization_and_power_rise_under_load(sim_factory: SimFactory) -> None:
    sim = sim_factory("--max-model-len", "4096", time_scale=1.0)
    body = {"model": MODEL, "prompt": "go", "max_tokens": 400, "ignore_eos": True}
    threads = [threading.Thread(target=call, args=(sim.base_url + "/v1/completions", body)) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.2)
        _, snap = call_json(sim.base_url + "/sim/gpu")
    finally:
        for t in threads:
            t.join()
    gpu = snap["gpus"][0]
    assert gpu["utilization_pct"] > 80.0
    assert gpu["power_watts"] > 250.0
    assert gpu["temperature_c"] > 40.0


def test_not_guarded_by_the_api_key(keyed_sim: SimHandle) -> None:
    assert call(keyed_sim.base_url + "/sim/gpu")[0] == 200
