"""--sim-time-scale runs the simulator faster than the modelled hardware while its metrics keep
reporting the hardware's latencies (modelled time)."""

from __future__ import annotations

import time

from tests.sim.conftest import MODEL, SimFactory
from tests.sim.http import call, call_json
from vllm_sim.profiles import PROFILES, derive_engine_shape, step_time_s


def histogram_mean(base_url: str, name: str) -> float:
    _, _, body = call(base_url + "/metrics")
    values = {}
    for line in body.decode().splitlines():
        for suffix in ("_sum", "_count"):
            if line.startswith(name + suffix + "{"):
                values[suffix] = float(line.rsplit(" ", 1)[1])
    return values["_sum"] / values["_count"]


def test_twenty_times_faster_in_wall_time_same_latencies_in_metrics(sim_factory: SimFactory) -> None:
    sim = sim_factory("--max-model-len", "4096", time_scale=20.0)
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 200, "ignore_eos": True}
    t0 = time.perf_counter()
    status, resp = call_json(sim.base_url + "/v1/completions", body)
    wall = time.perf_counter() - t0
    assert status == 200 and resp["usage"]["completion_tokens"] == 200
    shape = derive_engine_shape(PROFILES["h100-llama3-8b-fp16"], max_model_len=4096)
    decode = step_time_s(shape, num_tokens=1, num_seqs=1, context_tokens=100, attention_pairs=100)
    # 200 decode steps of ~7.5 ms are 1.5 s on the modelled H100, 75 ms of wall time at x20.
    assert wall < 200 * decode / 5
    itl = histogram_mean(sim.base_url, "vllm:inter_token_latency_seconds")
    assert 0.9 * decode < itl < 1.3 * decode
