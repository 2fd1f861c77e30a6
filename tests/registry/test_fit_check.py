"""fit_check: fits or not, KV tokens left and the largest context, from a version's architecture."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from models_registry.estimate import DEFAULT_OVERHEAD_BYTES, KV_BLOCK_TOKENS, architecture_from_config
from models_registry.models import Model, ModelVersion, QuantizationConfig
from models_registry.services import fit_check

pytestmark = pytest.mark.django_db

CONFIGS = Path(__file__).parent / "configs"
GIB = 1024**3


def version_from(name: str, quantization: QuantizationConfig | None = None) -> ModelVersion:
    config = json.loads((CONFIGS / f"{name}.json").read_text())
    return ModelVersion.objects.create(
        model=Model.objects.create(name=name),
        revision="published-config",
        source_kind="directory",
        source_path=f"/models/{name}",
        architecture=architecture_from_config(config),
        max_context=config["max_position_embeddings"],
        quantization=quantization,
    )


def test_llama_3_8b_fp16_on_an_80_gib_gpu() -> None:
    version = version_from("llama-3-8b")
    result = fit_check(version, "fp16", 80 * GIB, 0.9, 8192, 256)
    weights = 8_030_261_248 * 2
    left = int(80 * GIB * 0.9) - weights - DEFAULT_OVERHEAD_BYTES
    expected_tokens = left // (131072 * KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS
    assert result.fits
    assert result.weight_bytes == weights
    assert result.kv_tokens_available == expected_tokens
    # The model's own limit caps the answer even though the cache could hold far more.
    assert result.max_context_that_fits == 8192
    assert result.full_length_sequences == expected_tokens // 8192
    assert [s.label for s in result.steps][-4:] == [
        "left for KV cache",
        "KV cache tokens",
        "largest context that fits",
        "full-length sequences at once",
    ]


def test_llama_3_70b_fp16_does_not_fit_on_one_80_gib_gpu() -> None:
    result = fit_check(version_from("llama-3-70b"), "fp16", 80 * GIB, 0.9, 8192, 16)
    assert not result.fits
    assert result.kv_tokens_available == 0
    assert "do not fit" in result.reason


def test_llama_2_70b_awq_fits_on_one_80_gib_gpu() -> None:
    awq = QuantizationConfig.objects.create(name="awq", method="awq", bits=4, group_size=128)
    result = fit_check(version_from("llama-2-70b", awq), None, 80 * GIB, 0.9, 4096, 16)
    assert result.fits
    assert 36e9 < result.weight_bytes < 37.5e9


def test_kv_too_small_for_max_model_len_reports_largest_that_fits() -> None:
    version = version_from("llama-3-8b")
    # 24 GiB card: weights (16.06 GB) leave about 3.5 GiB, i.e. some 28k tokens at 128 KiB each.
    result = fit_check(version, "fp16", 24 * GIB, 0.9, 8192, 8)
    assert result.fits
    tight = fit_check(version, "fp16", 18 * GIB, 0.9, 8192, 8)
    assert not tight.fits
    assert 0 < tight.kv_tokens_available < 8192
    assert tight.max_context_that_fits == tight.kv_tokens_available
    assert f"lower max_model_len to {tight.max_context_that_fits:,}" in tight.reason


def test_other_reservations_on_the_same_gpu_count() -> None:
    version = version_from("llama-3-8b")
    alone = fit_check(version, "fp16", 24 * GIB, 0.9, 4096, 8)
    shared = fit_check(version, "fp16", 24 * GIB, 0.9, 4096, 8, other_reserved_bytes=2 * GIB)
    assert alone.kv_tokens_available - shared.kv_tokens_available == pytest.approx(2 * GIB / 131072, abs=16)


def test_max_model_len_beyond_the_models_context() -> None:
    result = fit_check(version_from("llama-3-8b"), "fp16", 80 * GIB, 0.9, 32768, 8)
    assert not result.fits
    assert "exceeds the model's maximum context of 8,192" in result.reason


def test_fp8_kv_cache_doubles_the_tokens() -> None:
    version = version_from("mistral-7b-v0.1")
    fp16 = fit_check(version, "fp16", 24 * GIB, 0.9, 4096, 8)
    fp8 = fit_check(version, "fp16", 24 * GIB, 0.9, 4096, 8, kv_cache_dtype="fp8")
    assert fp8.kv_bytes_per_token * 2 == fp16.kv_bytes_per_token
    assert fp8.kv_tokens_available == pytest.approx(2 * fp16.kv_tokens_available, abs=32)


def test_llama_3_70b_fp16_fits_on_four_80_gib_gpus_with_overhead_per_gpu() -> None:
    version = version_from("llama-3-70b")
    single_overhead = fit_check(version, "fp16", 4 * 80 * GIB, 0.9, 8192, 64)
    tp4 = fit_check(version, "fp16", 4 * 80 * GIB, 0.9, 8192, 64, tensor_parallel_size=4)
    assert tp4.fits
    # Three more GPUs' worth of overhead, expressed in 320 KiB tokens, rounded to 16-token blocks.
    lost = single_overhead.kv_tokens_available - tp4.kv_tokens_available
    assert lost == pytest.approx(3 * DEFAULT_OVERHEAD_BYTES / (320 * 1024), abs=16)
    assert "x 4 GPUs" in next(s for s in tp4.steps if s.label == "left for KV cache").formula
