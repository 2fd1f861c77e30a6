"""Builders for registry objects used across tests."""

from __future__ import annotations

from pathlib import Path

from models_registry.models import Model, ModelVersion, QuantizationConfig
from models_registry.services import register_version


def make_model(name: str = "tiny-llama", **fields: object) -> Model:
    return Model.objects.create(name=name, **fields)


def register_dir(
    directory: Path, model: Model | None = None, revision: str = "main", **kw: object
) -> ModelVersion:
    return register_version(model=model or make_model(), revision=revision, source_path=str(directory), **kw)  # type: ignore[arg-type]


def make_awq() -> QuantizationConfig:
    return QuantizationConfig.objects.create(name="awq-4bit-g128", method="awq", bits=4, group_size=128)
