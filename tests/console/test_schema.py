"""The OpenAPI schema is served, valid, and describes the console endpoints."""

from __future__ import annotations

import pytest
import yaml
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def test_schema_lists_console_endpoints(viewer_client: APIClient) -> None:
    resp = viewer_client.get("/api/schema/")
    assert resp.status_code == 200
    schema = yaml.safe_load(resp.content)
    assert schema["openapi"].startswith("3.")
    for path in ("/api/tenants/", "/api/keys/", "/api/keys/{id}/revoke/", "/api/audit/"):
        assert path in schema["paths"], path
    created = schema["paths"]["/api/keys/"]["post"]["responses"]["201"]["content"]["application/json"][
        "schema"
    ]
    assert created["$ref"].endswith("/ApiKeyCreated")


def test_docs_page_is_served(viewer_client: APIClient) -> None:
    assert viewer_client.get("/api/docs/").status_code == 200


def test_every_json_response_has_a_declared_shape() -> None:
    """No view answers an untyped dict: the console's generated types depend on it."""
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    untyped = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for status, response in operation.get("responses", {}).items():
                # Only JSON bodies need a shape; a download (the suite export's JSONL) has its own type.
                if not status.startswith("2") or "application/json" not in response.get("content", {}):
                    continue
                body = response["content"]["application/json"]["schema"]
                item = body.get("items", body) if body.get("type") == "array" else body
                if "$ref" not in item:
                    untyped.append(f"{method.upper()} {path} {status}: {body}")
    assert untyped == []


def test_committed_schema_is_current() -> None:
    """frontend/openapi.yaml (and so src/api/schema.d.ts) was regenerated after the last API change:
    run `make schema` when this fails."""
    from django.conf import settings
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.renderers import OpenApiYamlRenderer

    generated = OpenApiYamlRenderer().render(SchemaGenerator().get_schema(request=None, public=True))
    committed = (settings.BASE_DIR / "frontend" / "openapi.yaml").read_bytes()
    assert yaml.safe_load(generated) == yaml.safe_load(committed)
