"""Sleep mode as vLLM serves it (VLLM_SERVER_DEV_MODE=1, --enable-sleep-mode): /sleep, /wake_up,
/is_sleeping, requests held while asleep, freed memory on /sim/gpu, and a modelled wake-up time."""

from __future__ import annotations

import threading

from tests.sim.conftest import MODEL, SimFactory
from tests.sim.http import call, call_json
from vllm_sim.profiles import PROFILES, derive_engine_shape, wake_time_s

DEV = {"VLLM_SERVER_DEV_MODE": "1"}


def _gpu(base: str) -> dict:
    return call_json(base + "/sim/gpu")[1]["gpus"][0]


def _chat(base: str, out: list[int]) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    out.append(call(base + "/v1/chat/completions", body)[0])


def test_level1_frees_kv_and_weights_and_holds_requests(sim_factory: SimFactory) -> None:
    sim = sim_factory("--max-model-len", "4096", "--enable-sleep-mode", env=DEV, time_scale=50.0)
    awake = _gpu(sim.base_url)
    assert call(sim.base_url + "/sleep?level=1", method="POST")[0] == 200
    assert call_json(sim.base_url + "/is_sleeping") == (200, {"is_sleeping": True})
    asleep = _gpu(sim.base_url)
    shape = derive_engine_shape(PROFILES["h100-llama3-8b-fp16"], max_model_len=4096)
    freed = awake["memory_used_bytes"] - asleep["memory_used_bytes"]
    # Weights (now in host memory) and the whole KV cache left the GPU; context and graphs stay.
    assert asleep["sleep_level"] == 1 and asleep["offloaded_bytes"] == shape.weight_bytes_per_gpu
    assert freed > shape.weight_bytes_per_gpu + 0.4 * awake["memory_total_bytes"]
    assert asleep["memory_used_bytes"] > 0
    # Endpoints that need no weights still answer while asleep.
    assert call(sim.base_url + "/v1/models")[0] == 200
    # Inference is held (scheduling paused), not refused: it completes after /wake_up.
    statuses: list[int] = []
    t = threading.Thread(target=_chat, args=(sim.base_url, statuses))
    t.start()
    t.join(0.5)
    assert t.is_alive() and statuses == []
    assert call(sim.base_url + "/wake_up", method="POST")[0] == 200
    t.join(10)
    assert statuses == [200]
    assert call_json(sim.base_url + "/is_sleeping")[1] == {"is_sleeping": False}
    assert _gpu(sim.base_url)["memory_used_bytes"] == awake["memory_used_bytes"]


def test_level2_drops_weights_and_tags_wake_in_parts(sim_factory: SimFactory) -> None:
    sim = sim_factory("--max-model-len", "4096", "--enable-sleep-mode", env=DEV, time_scale=50.0)
    awake = _gpu(sim.base_url)["memory_used_bytes"]
    call(sim.base_url + "/sleep?level=2", method="POST")
    asleep = _gpu(sim.base_url)
    assert asleep["sleep_level"] == 2 and asleep["offloaded_bytes"] == 0
    call(sim.base_url + "/wake_up?tags=weights", method="POST")
    # Weights back, KV cache still asleep: is_sleeping stays true until every tag is restored.
    assert call_json(sim.base_url + "/is_sleeping")[1] == {"is_sleeping": True}
    partial = _gpu(sim.base_url)["memory_used_bytes"]
    assert asleep["memory_used_bytes"] < partial < awake
    call(sim.base_url + "/wake_up?tags=kv_cache", method="POST")
    assert call_json(sim.base_url + "/is_sleeping")[1] == {"is_sleeping": False}
    assert _gpu(sim.base_url)["memory_used_bytes"] == awake


def test_without_sleep_mode_nothing_is_freed(sim_factory: SimFactory) -> None:
    sim = sim_factory("--max-model-len", "4096", env=DEV)
    before = _gpu(sim.base_url)["memory_used_bytes"]
    call(sim.base_url + "/sleep?level=1", method="POST")
    assert call_json(sim.base_url + "/is_sleeping")[1] == {"is_sleeping": True}
    assert _gpu(sim.base_url)["memory_used_bytes"] == before


def test_dev_endpoints_absent_without_dev_mode(sim_factory: SimFactory) -> None:
    sim = sim_factory("--max-model-len", "4096", "--enable-sleep-mode")
    assert call(sim.base_url + "/sleep", method="POST")[0] == 404


def test_wake_time_model_grows_with_level_and_model_size() -> None:
    small = derive_engine_shape(PROFILES["a10-llama3-8b-int4"], max_model_len=4096)
    big = derive_engine_shape(PROFILES["h100-llama3-8b-fp16"], max_model_len=4096)
    both = frozenset({"weights", "kv_cache"})
    assert wake_time_s(small, 1, both) < wake_time_s(big, 1, both) < wake_time_s(big, 2, both)
    assert wake_time_s(big, 1, frozenset({"kv_cache"})) < wake_time_s(big, 1, both)
    assert wake_time_s(big, 1, frozenset()) == 0.0
