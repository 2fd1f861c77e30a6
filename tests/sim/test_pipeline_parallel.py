"""--pipeline-parallel-size: layers and their KV cache split over the stages, and the pipeline's time cost
(a lone sequence gains nothing and pays the hand-offs; a full pipeline divides compute-bound work)."""

from __future__ import annotations

import pytest

from tests.sim.conftest import MODEL, SimFactory
from tests.sim.http import call_json
from vllm_sim.profiles import (
    PROFILES,
    EngineConfigError,
    derive_engine_shape,
    pipeline_occupancy,
    step_time_s,
)

A100_70B = PROFILES["a100-llama3-70b-fp16"]
H100_8B = PROFILES["h100-llama3-8b-fp16"]


def _decode(shape: object, seqs: int, context: int = 1000) -> float:
    return step_time_s(
        shape,  # type: ignore[arg-type]
        num_tokens=seqs,
        num_seqs=seqs,
        context_tokens=seqs * context,
        attention_pairs=seqs * context,
    )


def test_stages_split_the_weights_and_the_kv_cache() -> None:
    tp4 = derive_engine_shape(A100_70B, max_model_len=8192, tensor_parallel_size=4)
    tp4_pp2 = derive_engine_shape(
        A100_70B, max_model_len=8192, tensor_parallel_size=4, pipeline_parallel_size=2
    )

    assert tp4_pp2.world_size == 8
    # 80 layers over 2 stages: each GPU holds 40 layers' weights and KV entries.
    assert tp4_pp2.kv_bytes_per_token_per_gpu * 2 == tp4.kv_bytes_per_token_per_gpu
    assert tp4_pp2.weight_bytes_per_gpu == pytest.approx(tp4.weight_bytes_per_gpu / 2, rel=1e-6)
    # Freed weight memory becomes KV cache, at half the bytes per token: more than twice the tokens.
    assert tp4_pp2.kv_cache_size_tokens > 2 * tp4.kv_cache_size_tokens


def test_pipeline_lets_a_model_fit_that_one_stage_cannot_hold() -> None:
    with pytest.raises(EngineConfigError, match="pipeline_parallel_size=1"):
        derive_engine_shape(A100_70B, max_model_len=8192, tensor_parallel_size=1)
    shape = derive_engine_shape(
        A100_70B, max_model_len=8192, tensor_parallel_size=1, pipeline_parallel_size=4
    )
    assert shape.num_gpu_blocks > 0


def test_more_stages_than_layers_is_refused() -> None:
    with pytest.raises(EngineConfigError, match="between 1 and the model's 32 hidden layers"):
        derive_engine_shape(H100_8B, max_model_len=4096, pipeline_parallel_size=33)


def test_a_lone_sequence_gains_nothing_and_pays_the_hand_offs() -> None:
    one = derive_engine_shape(H100_8B, max_model_len=4096)
    two = derive_engine_shape(H100_8B, max_model_len=4096, pipeline_parallel_size=2)

    # Memory-bound decode at batch 1: the two stages stream the same weights one after the other.
    assert _decode(two, 1) > _decode(one, 1)
    assert _decode(two, 1) < 1.1 * _decode(one, 1)
    # Each GPU idles half the step: the bubble.
    assert pipeline_occupancy(two, 1) == 0.5
    assert pipeline_occupancy(two, 64) == 1.0


def test_a_full_pipeline_divides_compute_bound_work() -> None:
    one = derive_engine_shape(H100_8B, max_model_len=4096)
    two = derive_engine_shape(H100_8B, max_model_len=4096, pipeline_parallel_size=2)
    prefill = {
        "num_tokens": 8192,
        "num_seqs": 8,
        "context_tokens": 8192,
        "attention_pairs": 8 * 1024 * 1024 / 2,
    }

    ratio = step_time_s(two, **prefill) / step_time_s(one, **prefill)  # type: ignore[arg-type]

    # Two micro-batches in flight over two stages: about half the time (plus hand-offs and overheads).
    assert 0.5 < ratio < 0.6
    # Tokens per GPU-second at batch 1 fall to about 1/PP: the cost of bubbles at low batch.
    per_gpu_one = 1 / _decode(one, 1)
    per_gpu_two = 1 / _decode(two, 1) / 2
    assert per_gpu_two == pytest.approx(per_gpu_one / 2, rel=0.1)


def test_served_with_the_flag_and_its_short_alias(sim_factory: SimFactory) -> None:
    sim = sim_factory("--max-model-len", "4096", "-pp", "2", "--sim-gpu-index", "2")

    _, gpus = call_json(sim.base_url + "/sim/gpu")
    assert [g["index"] for g in gpus["gpus"]] == [2, 3]
    status, body = call_json(
        sim.base_url + "/v1/completions",
        {"model": MODEL, "prompt": "hi", "max_tokens": 8, "ignore_eos": True},
    )
    assert status == 200 and body["usage"]["completion_tokens"] == 8
