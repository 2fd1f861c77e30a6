"""Tenants over the API: create with quotas, update, list with filters, and every bad-input case."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from console.models import Quota, Tenant
from core.models import AuditEvent
from tests.console.factories import make_key, make_tenant

pytestmark = pytest.mark.django_db


def test_admin_creates_tenant_with_quota(admin_client: APIClient) -> None:
    resp = admin_client.post(
        "/api/tenants/",
        {
            "name": "acme",
            "description": "first",
            "quota": {"requests_per_minute": 60, "tokens_per_minute": 1000},
        },
        format="json",
    )
    assert resp.status_code == 201, resp.content
    tenant = Tenant.objects.get(name="acme")
    assert tenant.quota.requests_per_minute == 60
    # A limit the request leaves out is the default's (tests/console/test_tenant_default_quota.py).
    assert tenant.quota.max_concurrent_requests == settings.DEFAULT_TENANT_QUOTA["max_concurrent_requests"]
    assert resp.json()["quota"]["tokens_per_minute"] == 1000


def test_update_quota_and_clear_it(admin_client: APIClient) -> None:
    tenant = make_tenant("acme", requests_per_minute=10)
    resp = admin_client.patch(
        f"/api/tenants/{tenant.pk}/", {"quota": {"requests_per_minute": 20}}, format="json"
    )
    assert resp.status_code == 200, resp.content
    assert Quota.objects.get(tenant=tenant).requests_per_minute == 20
    resp = admin_client.patch(f"/api/tenants/{tenant.pk}/", {"quota": None}, format="json")
    assert resp.status_code == 200
    assert not Quota.objects.filter(tenant=tenant).exists()


def test_duplicate_name_is_a_field_error(admin_client: APIClient) -> None:
    make_tenant("acme")
    resp = admin_client.post("/api/tenants/", {"name": "acme"}, format="json")
    assert resp.status_code == 400
    assert "name" in resp.json()


def test_negative_quota_is_a_field_error_and_nothing_is_written(admin_client: APIClient) -> None:
    resp = admin_client.post(
        "/api/tenants/", {"name": "neg", "quota": {"requests_per_minute": -1}}, format="json"
    )
    assert resp.status_code == 400
    assert "requests_per_minute" in resp.json()["quota"]
    assert not Tenant.objects.filter(name="neg").exists()


def test_unknown_fields_are_refused(admin_client: APIClient) -> None:
    resp = admin_client.post("/api/tenants/", {"name": "x", "colour": "blue"}, format="json")
    assert resp.status_code == 400
    assert resp.json()["colour"] == ["Unknown or read-only field."]
    resp = admin_client.post("/api/tenants/", {"name": "y", "quota": {"rpm": 5}}, format="json")
    assert resp.status_code == 400
    assert "rpm" in resp.json()["quota"]


def test_list_filters_and_paginates(admin_client: APIClient) -> None:
    for i in range(5):
        make_tenant(f"t{i}")
    Tenant.objects.filter(name="t3").update(is_active=False)
    resp = admin_client.get("/api/tenants/?limit=2")
    body = resp.json()
    assert body["count"] == 5 and len(body["results"]) == 2 and body["next"]
    resp = admin_client.get("/api/tenants/?is_active=false")
    assert [t["name"] for t in resp.json()["results"]] == ["t3"]
    resp = admin_client.get("/api/tenants/?search=t4")
    assert [t["name"] for t in resp.json()["results"]] == ["t4"]


def test_list_query_count_does_not_grow_with_tenants(admin_client: APIClient) -> None:
    for i in range(3):
        make_key(make_tenant(f"a{i}", requests_per_minute=1))
    with CaptureQueriesContext(connection) as small:
        admin_client.get("/api/tenants/")
    for i in range(10):
        make_key(make_tenant(f"b{i}", requests_per_minute=1))
    with CaptureQueriesContext(connection) as large:
        resp = admin_client.get("/api/tenants/")
    assert resp.json()["count"] == 13
    assert len(large) == len(small)


def test_writes_are_audited_with_before_and_after(admin_client: APIClient) -> None:
    resp = admin_client.post("/api/tenants/", {"name": "acme"}, format="json")
    tenant_id = resp.json()["id"]
    admin_client.patch(f"/api/tenants/{tenant_id}/", {"description": "changed"}, format="json")
    admin_client.delete(f"/api/tenants/{tenant_id}/")
    events = list(AuditEvent.objects.filter(object_id=str(tenant_id)).order_by("id"))
    assert [e.action for e in events] == ["create", "update", "delete"]
    before, after = events[1].before or {}, events[1].after or {}
    assert before["description"] == "" and after["description"] == "changed"
    assert events[0].actor_name == "alice-admin"
    assert (events[2].before or {})["name"] == "acme" and events[2].after is None
