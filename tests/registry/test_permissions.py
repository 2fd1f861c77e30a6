"""Each role against each registry endpoint: admins write, everyone signed in reads."""

from __future__ import annotations

from pathlib import Path

import pytest
from rest_framework.test import APIClient

from models_registry.models import ModelAlias, QuantizationConfig
from tests.registry.factories import register_dir

pytestmark = pytest.mark.django_db


def targets(model_dir: Path) -> list[tuple[str, str, dict[str, object] | None]]:
    version = register_dir(model_dir)
    quant = QuantizationConfig.objects.create(name="fp8", method="fp8", bits=8)
    alias = ModelAlias.objects.create(name="tiny", active_version=version)
    return [
        ("get", "/api/models/", None),
        ("post", "/api/models/", {"name": "new-family", "task_tags": ["chat"]}),
        ("patch", f"/api/models/{version.model_id}/", {"description": "x"}),
        ("get", "/api/model-versions/", None),
        ("get", f"/api/model-versions/{version.pk}/files/", None),
        ("get", f"/api/model-versions/{version.pk}/verifications/", None),
        ("get", "/api/model-versions/lineage/", None),
        ("get", "/api/quantization-configs/", None),
        (
            "post",
            "/api/quantization-configs/",
            {"name": "awq", "method": "awq", "bits": 4, "group_size": 128},
        ),
        ("patch", f"/api/quantization-configs/{quant.pk}/", {"description": "x"}),
        ("get", "/api/model-aliases/", None),
        ("patch", f"/api/model-aliases/{alias.pk}/", {"description": "x"}),
        ("delete", f"/api/model-aliases/{alias.pk}/", None),
    ]


@pytest.mark.parametrize("role_client", ["viewer_client", "evaluator_client"])
def test_read_only_roles(role_client: str, request: pytest.FixtureRequest, model_dir: Path) -> None:
    client: APIClient = request.getfixturevalue(role_client)
    for method, url, body in targets(model_dir):
        status = getattr(client, method)(url, body, format="json").status_code
        assert status == (200 if method == "get" else 403), (method, url, status)


def test_admin_may_write(admin_client: APIClient, model_dir: Path) -> None:
    expected = {"get": 200, "post": 201, "patch": 200, "delete": 204}
    for method, url, body in targets(model_dir):
        status = getattr(admin_client, method)(url, body, format="json").status_code
        assert status == expected[method], (method, url, status)


def test_anonymous_gets_401(anon_client: APIClient, model_dir: Path) -> None:
    for method, url, body in targets(model_dir):
        assert getattr(anon_client, method)(url, body, format="json").status_code == 401, (method, url)


def test_quantization_config_validation(admin_client: APIClient) -> None:
    bad_bits = admin_client.post(
        "/api/quantization-configs/", {"name": "a", "method": "awq", "bits": 8}, format="json"
    )
    assert bad_bits.status_code == 400 and "bits" in bad_bits.json()
    bad_group = admin_client.post(
        "/api/quantization-configs/",
        {"name": "b", "method": "fp8", "bits": 8, "group_size": 128},
        format="json",
    )
    assert bad_group.status_code == 400 and "group_size" in bad_group.json()
