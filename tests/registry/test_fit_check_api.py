"""POST /api/fit-check/: every signed-in role may ask; the answer shows its arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from models_registry.estimate import architecture_from_config
from models_registry.models import Model, ModelVersion

pytestmark = pytest.mark.django_db

CONFIGS = Path(__file__).parent / "configs"


@pytest.fixture
def llama_3_8b() -> ModelVersion:
    config = json.loads((CONFIGS / "llama-3-8b.json").read_text())
    return ModelVersion.objects.create(
        model=Model.objects.create(name="llama-3-8b"),
        revision="hf",
        source_kind="directory",
        source_path="/models/llama-3-8b",
        architecture=architecture_from_config(config),
        max_context=8192,
    )


def test_viewer_gets_verdict_and_steps(viewer_client: APIClient, llama_3_8b: ModelVersion) -> None:
    response = viewer_client.post(
        "/api/fit-check/",
        {
            "version": llama_3_8b.pk,
            "gpu_memory_gib": 24,
            "max_model_len": 8192,
            "max_num_seqs": 16,
            "method": "fp16",
        },
        format="json",
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["fits"] is True
    assert body["kv_bytes_per_token"] == 131072
    assert body["weight_bytes"] == 8_030_261_248 * 2
    labels = [s["label"] for s in body["steps"]]
    assert "KV cache per token" in labels and "engine budget" in labels
    budget = next(s for s in body["steps"] if s["label"] == "engine budget")
    assert budget["value"] == int(24 * 1024**3 * 0.92)  # vLLM's default when omitted (cache.py:80)
    assert "0.92 utilization" in budget["formula"]


def test_int4_method_fits_where_fp16_does_not(admin_client: APIClient, llama_3_8b: ModelVersion) -> None:
    body = {"version": llama_3_8b.pk, "gpu_memory_gib": 16, "max_model_len": 8192}
    fp16 = admin_client.post("/api/fit-check/", {**body, "method": "fp16"}, format="json").json()
    q4 = admin_client.post("/api/fit-check/", {**body, "method": "gguf-q4_k"}, format="json").json()
    assert fp16["fits"] is False
    assert q4["fits"] is True


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"max_model_len": 4096}, "gpu_memory_gib"),
        ({"gpu_memory_gib": 24, "max_model_len": 0}, "max_model_len"),
        (
            {"gpu_memory_gib": 24, "max_model_len": 4096, "gpu_memory_utilization": 1.5},
            "gpu_memory_utilization",
        ),
        ({"gpu_memory_gib": 24, "max_model_len": 4096, "method": "int3"}, "method"),
        ({"gpu_memory_gib": 24, "max_model_len": 4096, "surprise": 1}, "surprise"),
    ],
)
def test_bad_input_is_a_field_error(
    admin_client: APIClient, llama_3_8b: ModelVersion, payload: dict[str, object], field: str
) -> None:
    response = admin_client.post("/api/fit-check/", {"version": llama_3_8b.pk, **payload}, format="json")
    assert response.status_code == 400
    assert field in response.json()


def test_version_without_architecture_is_a_400(admin_client: APIClient) -> None:
    bare = ModelVersion.objects.create(
        model=Model.objects.create(name="bare"), revision="r", source_kind="directory", source_path="/m"
    )
    response = admin_client.post(
        "/api/fit-check/", {"version": bare.pk, "gpu_memory_gib": 24, "max_model_len": 4096}, format="json"
    )
    assert response.status_code == 400
    assert "no architecture" in response.json()["version"][0]


def test_anonymous_cannot_use_it(anon_client: APIClient, llama_3_8b: ModelVersion) -> None:
    body = {"version": llama_3_8b.pk, "gpu_memory_gib": 24, "max_model_len": 4096}
    assert anon_client.post("/api/fit-check/", body, format="json").status_code == 401
