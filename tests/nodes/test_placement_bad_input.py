"""Placement help refuses input it cannot answer with JSON field errors, as every /api/ endpoint does."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"engine": "sim", "bogus": 1}, "bogus"),
        ({"engine": "tgi"}, "engine"),
        ({"engine": "sim", "gpu_indices": [0]}, "gpu_indices"),
        ({"engine": "sim", "gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"engine": "sim", "max_model_len": 0}, "max_model_len"),
        ({"engine": "sim", "model_version": 999999}, "model_version"),
    ],
)
def test_bad_input_is_a_field_error(admin_client: Any, host: Any, body: dict[str, Any], field: str) -> None:
    response = admin_client.post("/api/deployments/placement/", body, format="json")
    assert response.status_code == 400
    assert field in response.json()


def test_gpus_the_host_lacks_and_a_tp_mismatch(admin_client: Any, llama_version: Any, host: Any) -> None:
    base = {"model_version": llama_version.pk, "engine": "sim", "host": host.pk}
    missing = admin_client.post("/api/deployments/placement/", {**base, "gpu_indices": [3]}, format="json")
    assert missing.status_code == 400
    assert "has no GPU 3" in missing.json()["gpu_indices"][0]
    mismatch = admin_client.post(
        "/api/deployments/placement/", {**base, "gpu_indices": [0], "tensor_parallel_size": 2}, format="json"
    )
    assert mismatch.status_code == 400 and "tensor_parallel_size" in mismatch.json()


def test_a_version_without_architecture_says_so(admin_client: Any, llama_version: Any, host: Any) -> None:
    llama_version.architecture = {}
    llama_version.save(update_fields=["architecture"])
    response = admin_client.post(
        "/api/deployments/placement/",
        {"model_version": llama_version.pk, "engine": "sim", "host": host.pk},
        format="json",
    )
    assert response.status_code == 400
    assert "fit check could not run" in response.json()["model_version"][0]
