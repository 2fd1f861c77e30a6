"""What the routing snapshot learns from each deployment's engine: which aliases count prompts with the
simulator's rule, and which cannot answer /v1/embeddings."""

from __future__ import annotations

import secrets

import pytest

from models_registry.models import ModelAlias, ModelVersion
from nodes.models import Deployment, Host
from routing.proxy.config import load_routing_snapshot
from tests.routing.fleet import ensure_alias

pytestmark = pytest.mark.django_db


def _deployment(alias: str, engine: str, *extra_args: str, port: int) -> Deployment:
    ensure_alias(alias)
    host, _ = Host.objects.get_or_create(name="facts-host", defaults={"address": "127.0.0.1"})
    return Deployment.objects.create(
        name=f"{alias}-{port}",
        model_version=ModelAlias.objects.get(name=alias).active_version,
        host=host,
        port=port,
        served_model_name=alias,
        state="ready",
        start_token=secrets.token_hex(8),
        engine=engine,
        extra_args=list(extra_args),
    )


def test_engine_facts_in_the_snapshot() -> None:
    _deployment("sim-only", "sim", "--sim-time-scale", "5", port=9001)
    _deployment("sim-own-tokenizer", "sim", "--tokenizer", "/models/tok", port=9002)
    _deployment("mixed", "sim", port=9003)
    _deployment("mixed", "vllm", port=9004)
    _deployment("cpu", "llamacpp", port=9005)
    _deployment("cpu-embed", "llamacpp", "--embedding", "true", port=9006)
    snap = load_routing_snapshot()
    assert {a for a, m in snap.models.items() if m.sim_tokens} == {"sim-only"}
    assert snap.no_embeddings == {"sim-only", "sim-own-tokenizer", "cpu"}


def test_a_version_with_a_tokenizer_file_is_counted_with_it() -> None:
    dep = _deployment("sim-only", "sim", port=9001)
    ModelVersion.objects.filter(pk=dep.model_version_id).update(tokenizer_path="/models/llama/tokenizer.json")
    info = load_routing_snapshot().models["sim-only"]
    assert info.tokenizer_path and not info.sim_tokens
