"""Lineage: a quantized version records its full-precision parent; the API returns the tree."""

from __future__ import annotations

from pathlib import Path

import pytest
from rest_framework.test import APIClient

from models_registry.services import RegistrationError
from tests.registry.conftest import make_model_dir
from tests.registry.factories import make_awq, make_model, register_dir

pytestmark = pytest.mark.django_db


def test_quantized_child_points_at_its_reference(admin_client: APIClient, model_root: Path) -> None:
    model = make_model()
    full = register_dir(make_model_dir(model_root, "fp16"), model=model, revision="fp16")
    awq = make_awq()
    response = admin_client.post(
        "/api/model-versions/",
        {
            "model": model.pk,
            "revision": "awq",
            "source_path": str(make_model_dir(model_root, "awq")),
            "parent": full.pk,
            "quantization": awq.pk,
        },
        format="json",
    )
    assert response.status_code == 201, response.json()
    child = response.json()
    assert child["parent"] == full.pk
    assert child["parent_label"] == "tiny-llama@fp16"
    assert child["quantization_name"] == "awq-4bit-g128"
    assert full.quantized_children.get().pk == child["id"]

    tree = admin_client.get("/api/model-versions/lineage/").json()
    assert len(tree) == 1
    assert tree[0]["id"] == full.pk
    assert [(c["id"], c["method"], c["children"]) for c in tree[0]["children"]] == [(child["id"], "awq", [])]


def test_parent_must_be_full_precision(model_root: Path) -> None:
    model = make_model()
    full = register_dir(make_model_dir(model_root, "fp16"), model=model, revision="fp16")
    child = register_dir(make_model_dir(model_root, "awq"), model=model, revision="awq", parent=full)
    with pytest.raises(RegistrationError, match="full-precision"):
        register_dir(make_model_dir(model_root, "awq2"), model=model, revision="awq2", parent=child)


def test_parent_in_use_cannot_be_deleted(admin_client: APIClient, model_root: Path) -> None:
    model = make_model()
    full = register_dir(make_model_dir(model_root, "fp16"), model=model, revision="fp16")
    register_dir(make_model_dir(model_root, "awq"), model=model, revision="awq", parent=full)
    response = admin_client.delete(f"/api/model-versions/{full.pk}/")
    assert response.status_code == 400
    assert "tiny-llama@awq" in response.json()["non_field_errors"][0]
