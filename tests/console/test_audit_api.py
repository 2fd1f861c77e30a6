"""The audit log: filters, and secrets redacted at any depth."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from console.models import User
from core.audit import REDACTED, record_audit, redact
from core.models import AuditEvent
from tests.console.factories import make_tenant

pytestmark = pytest.mark.django_db


def test_redact_replaces_secrets_at_any_depth() -> None:
    data = {"name": "x", "key": "ick_secret", "nested": [{"password": "p", "ok": 1}], "engine_api_key": "e"}
    assert redact(data) == {
        "name": "x",
        "key": REDACTED,
        "nested": [{"password": REDACTED, "ok": 1}],
        "engine_api_key": REDACTED,
    }


def test_record_audit_never_stores_secrets(admin_user: User) -> None:
    tenant = make_tenant()
    event = record_audit(
        actor=admin_user, action="update", obj=tenant, after={"secret": "s3", "name": "acme"}
    )
    event.refresh_from_db()
    assert event.after == {"secret": REDACTED, "name": "acme"}


def test_filters_by_action_type_actor_and_time(admin_client: APIClient) -> None:
    admin_client.post("/api/tenants/", {"name": "a"}, format="json")
    admin_client.post("/api/tenants/", {"name": "b"}, format="json")
    tenant_id = admin_client.get("/api/tenants/?search=a").json()["results"][0]["id"]
    admin_client.delete(f"/api/tenants/{tenant_id}/")
    AuditEvent.objects.create(
        action="create", object_type="console.tenant", created_at=timezone.now() - dt.timedelta(days=2)
    )
    assert admin_client.get("/api/audit/?action=delete").json()["count"] == 1
    assert admin_client.get("/api/audit/?object_type=console.tenant").json()["count"] == 4
    assert admin_client.get("/api/audit/?actor_name=alice-admin").json()["count"] == 3
    since = (timezone.now() - dt.timedelta(days=1)).isoformat()
    assert admin_client.get("/api/audit/", {"since": since}).json()["count"] == 3


def test_audit_log_is_read_only(admin_client: APIClient) -> None:
    assert admin_client.post("/api/audit/", {"action": "create"}, format="json").status_code == 405
