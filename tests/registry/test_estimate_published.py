"""Memory estimates from real published configs agree with the published figures.

Figures: parameter counts as the Hugging Face model pages state them; fp16/bf16 weight size is the sum
of the published safetensors shards; int4 sizes are the published file sizes of TheBloke's
Llama-2-7B-AWQ / Llama-2-70B-AWQ (4 bit, group 128, main branch) and Llama-2-7B-GGUF Q4_0.
KV-cache bytes per token are exact: 2 x layers x KV heads x head dim x 2 bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from models_registry.estimate import architecture_from_config, estimate_memory

CONFIGS = Path(__file__).parent / "configs"
GB = 1e9
KIB = 1024


def arch(name: str) -> dict[str, object]:
    return architecture_from_config(json.loads((CONFIGS / f"{name}.json").read_text()))


@pytest.mark.parametrize(
    ("name", "published_params", "published_fp16_bytes", "kv_per_token"),
    [
        ("llama-3-8b", 8.03e9, 16.06 * GB, 128 * KIB),
        ("llama-3-70b", 70.55e9, 141.1 * GB, 320 * KIB),
        ("mistral-7b-v0.1", 7.24e9, 14.48 * GB, 128 * KIB),
        ("llama-2-7b", 6.74e9, 13.48 * GB, 512 * KIB),
        ("mixtral-8x7b", 46.7e9, 93.4 * GB, 128 * KIB),
    ],
)
def test_fp16_weights_and_kv_per_token(
    name: str, published_params: float, published_fp16_bytes: float, kv_per_token: int
) -> None:
    est = estimate_memory(arch(name), "fp16")
    assert est.parameter_count == pytest.approx(published_params, rel=0.005)
    assert est.weight_bytes == pytest.approx(published_fp16_bytes, rel=0.01)
    assert est.kv_bytes_per_token == kv_per_token


@pytest.mark.parametrize(
    ("name", "method", "published_bytes"),
    [
        ("llama-2-7b", "awq", 3.89 * GB),
        ("llama-2-70b", "awq", 36.61 * GB),
        ("llama-2-7b", "gguf-q4_0", 3.83 * GB),
    ],
)
def test_int4_weights(name: str, method: str, published_bytes: float) -> None:
    class Awq:
        bits = 4
        group_size = 128
        kv_cache_dtype = "auto"

    quant: object = method
    if method == "awq":
        awq = Awq()
        awq.method = "awq"  # type: ignore[attr-defined]
        quant = awq
    est = estimate_memory(arch(name), quant)
    assert est.weight_bytes == pytest.approx(published_bytes, rel=0.02)


def test_fp8_kv_cache_halves_bytes_per_token() -> None:
    assert estimate_memory(arch("llama-3-8b"), None, "fp8").kv_bytes_per_token == 64 * KIB


def test_fp8_weights_keep_embeddings_at_16_bit() -> None:
    a = arch("llama-3-8b")
    fp8 = estimate_memory(a, "fp8").weight_bytes
    embeddings_and_head = 2 * 128256 * 4096
    # Linear layers at one byte, embeddings and lm_head still two bytes each.
    assert fp8 == pytest.approx((8.03e9 - embeddings_and_head) + embeddings_and_head * 2, rel=0.005)


def test_steps_show_the_arithmetic() -> None:
    est = estimate_memory(arch("llama-3-70b"), "fp16")
    kv_step = next(s for s in est.steps if s.label == "KV cache per token")
    assert (
        "80 layers" in kv_step.formula
        and "8 KV heads" in kv_step.formula
        and "128 head dim" in kv_step.formula
    )
    assert kv_step.value == 320 * KIB
