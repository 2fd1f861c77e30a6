"""The KV-cache sizing and the roofline step time of the profiles (pure functions)."""

from __future__ import annotations

import pytest

from vllm_sim.profiles import (
    PROFILES,
    EngineConfigError,
    batch_defaults,
    derive_engine_shape,
    knee_tokens,
    step_time_s,
)

H100_8B = PROFILES["h100-llama3-8b-fp16"]
A10_8B = PROFILES["a10-llama3-8b-int4"]
A100_70B = PROFILES["a100-llama3-70b-fp16"]


def test_kv_bytes_per_token_follow_the_model_config() -> None:
    # Llama-3.1-8B: 2 (K and V) x 32 layers x 8 KV heads x 128 x 2 bytes = 128 KiB per token.
    assert derive_engine_shape(H100_8B, max_model_len=8192).kv_bytes_per_token_per_gpu == 131072
    # 70B: 80 layers; with TP 4 each GPU keeps 2 of the 8 KV heads.
    shape = derive_engine_shape(A100_70B, max_model_len=8192, tensor_parallel_size=4)
    assert shape.kv_bytes_per_token_per_gpu == 2 * 80 * 2 * 128 * 2


def test_block_budget_is_memory_times_utilization_minus_weights_and_reserves() -> None:
    shape = derive_engine_shape(H100_8B, max_model_len=8192, gpu_memory_utilization=0.92)
    budget = H100_8B.gpu.memory_bytes * 0.92 - shape.weight_bytes_per_gpu - shape.activation_bytes_per_gpu
    budget -= H100_8B.non_torch_bytes
    assert shape.num_gpu_blocks == int(budget // (131072 * 16))
    assert shape.memory_used_bytes_per_gpu <= H100_8B.gpu.memory_bytes * 0.92


def test_fp8_kv_cache_doubles_the_blocks() -> None:
    auto = derive_engine_shape(H100_8B, max_model_len=8192)
    fp8 = derive_engine_shape(H100_8B, max_model_len=8192, kv_cache_dtype="fp8")
    assert fp8.num_gpu_blocks == pytest.approx(2 * auto.num_gpu_blocks, abs=2)


def test_lower_utilization_means_fewer_blocks() -> None:
    high = derive_engine_shape(H100_8B, max_model_len=8192, gpu_memory_utilization=0.92)
    low = derive_engine_shape(H100_8B, max_model_len=8192, gpu_memory_utilization=0.5)
    freed = (0.92 - 0.5) * H100_8B.gpu.memory_bytes
    assert (high.num_gpu_blocks - low.num_gpu_blocks) * 16 * 131072 == pytest.approx(freed, rel=0.01)


def test_vllm_batch_defaults_per_gpu() -> None:
    assert batch_defaults(H100_8B.gpu) == (1024, 8192)
    assert batch_defaults(A100_70B.gpu) == (256, 2048)  # A100 is vLLM's exception
    assert batch_defaults(A10_8B.gpu) == (256, 2048)


def test_start_up_failures_match_vllm() -> None:
    with pytest.raises(EngineConfigError, match="CUDA out of memory"):
        derive_engine_shape(A100_70B, max_model_len=8192, tensor_parallel_size=1)
    with pytest.raises(EngineConfigError, match="estimated maximum model length"):
        derive_engine_shape(A10_8B)  # the full 131072 context
    with pytest.raises(EngineConfigError, match="greater than the derived max_model_len"):
        derive_engine_shape(H100_8B, max_model_len=200_000)
    with pytest.raises(EngineConfigError, match="No available memory for the cache blocks"):
        derive_engine_shape(H100_8B, max_model_len=8192, gpu_memory_utilization=0.2)


@pytest.mark.parametrize("name", list(PROFILES))
def test_decode_at_batch_one_is_weights_over_bandwidth_plus_overhead(name: str) -> None:
    p = PROFILES[name]
    shape = derive_engine_shape(p, max_model_len=8192, tensor_parallel_size=p.recommended_tp)
    t = step_time_s(shape, num_tokens=1, num_seqs=1, context_tokens=0, attention_pairs=0)
    floor = shape.weight_bytes_per_gpu / (p.gpu.mem_bandwidth * p.bandwidth_efficiency)
    comm = 2 * p.model.num_layers * p.allreduce_latency_s if p.recommended_tp > 1 else 0.0
    assert t == pytest.approx(floor + p.step_overhead_s + p.per_seq_overhead_s + comm)


def test_steps_are_memory_bound_below_the_knee_and_compute_bound_above() -> None:
    shape = derive_engine_shape(H100_8B, max_model_len=8192)
    knee = knee_tokens(shape)
    assert 100 < knee < 300
    t1 = step_time_s(shape, num_tokens=1, num_seqs=1, context_tokens=0, attention_pairs=0)
    t_half = step_time_s(shape, num_tokens=int(knee / 2), num_seqs=1, context_tokens=0, attention_pairs=0)
    t4 = step_time_s(shape, num_tokens=int(knee * 4), num_seqs=1, context_tokens=0, attention_pairs=0)
    t8 = step_time_s(shape, num_tokens=int(knee * 8), num_seqs=1, context_tokens=0, attention_pairs=0)
    assert t_half == pytest.approx(t1)
    assert t8 / t4 == pytest.approx(2.0, rel=0.15)
    # A prefill of 512 tokens costs a few decode steps, not 512 of them.
    t512 = step_time_s(shape, num_tokens=512, num_seqs=1, context_tokens=512, attention_pairs=512 * 256)
    assert 1.5 * t1 < t512 < 5 * t1
