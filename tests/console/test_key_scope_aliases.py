"""A key's scopes name aliases the proxy can route: unknown names are field errors, and the key dialog
reads the names it may offer from one endpoint."""

from __future__ import annotations

import pytest
from pytest_django.fixtures import Settings
from rest_framework.test import APIClient

from console.models import ApiKey
from routing.models import RoutePool
from tests.console.factories import make_alias, make_key, make_tenant

pytestmark = pytest.mark.django_db


def test_scope_aliases_lists_every_routable_name(viewer_client: APIClient, settings: Settings) -> None:
    make_alias("chat")
    RoutePool.objects.create(name="code-fast", alias="code")
    settings.PROXY_STATIC_ENDPOINTS = "bench=http://127.0.0.1:9"
    resp = viewer_client.get("/api/keys/scope-aliases/")
    assert resp.status_code == 200
    assert resp.json() == {"aliases": ["bench", "chat", "code"]}


def test_unknown_aliases_are_a_field_error_naming_them(admin_client: APIClient) -> None:
    tenant = make_tenant()
    make_alias("chat")
    resp = admin_client.post(
        "/api/keys/", {"tenant": tenant.pk, "name": "k", "scopes": ["chat", "chta", "vision"]}, format="json"
    )
    assert resp.status_code == 400
    (message,) = resp.json()["scopes"]
    assert "'chta', 'vision'" in message and "scoped to: chat" in message
    assert not ApiKey.objects.exists()


def test_a_key_scoped_to_known_aliases_is_stored_and_rescoped(admin_client: APIClient) -> None:
    tenant = make_tenant()
    make_alias("chat")
    make_alias("code")
    resp = admin_client.post(
        "/api/keys/", {"tenant": tenant.pk, "name": "k", "scopes": ["chat"]}, format="json"
    )
    assert resp.status_code == 201, resp.content
    key_id = resp.json()["id"]
    resp = admin_client.patch(f"/api/keys/{key_id}/", {"scopes": ["chat", "code"]}, format="json")
    assert resp.status_code == 200, resp.content
    assert ApiKey.objects.get(pk=key_id).scopes == ["chat", "code"]
    resp = admin_client.patch(f"/api/keys/{key_id}/", {"scopes": []}, format="json")
    assert ApiKey.objects.get(pk=key_id).scopes == []  # every alias


def test_a_scope_whose_alias_is_gone_may_stay_but_not_be_added(admin_client: APIClient) -> None:
    issued = make_key(make_tenant(), scopes=["retired"])  # its alias was deleted since
    make_alias("chat")
    resp = admin_client.patch(
        f"/api/keys/{issued.api_key.pk}/", {"name": "renamed", "scopes": ["retired", "chat"]}, format="json"
    )
    assert resp.status_code == 200, resp.content
    other = make_key(make_tenant("other"))
    resp = admin_client.patch(f"/api/keys/{other.api_key.pk}/", {"scopes": ["retired"]}, format="json")
    assert resp.status_code == 400 and "'retired'" in resp.json()["scopes"][0]
