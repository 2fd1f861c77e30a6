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
