"""Query parameters that were 500s, found by fuzzing /api/ (tests/console/test_api_fuzz.py): each is now
a 400 naming the parameter, or is read correctly."""

from __future__ import annotations

import datetime as dt

import pytest
from rest_framework.test import APIClient

from console.models import User
from core.audit import record_audit
from core.choices import AuditAction
from models_registry.models import Model, ModelVersion

pytestmark = pytest.mark.django_db


@pytest.fixture
def client(admin_user: User) -> APIClient:
    # Answers, not raised exceptions: a 500 must show as a 500 here.
    api = APIClient(raise_request_exception=False)
    api.force_authenticate(admin_user)
    return api


@pytest.mark.parametrize("path", ["/api/audit/", "/api/request-log/"])
def test_an_offset_postgresql_cannot_take_is_read_in_utc(client: APIClient, path: str) -> None:
    """Python takes UTC offsets up to ±23:59, PostgreSQL ±15:59: the filter converts to UTC first."""
    resp = client.get(path, {"since": "0462-01-22T04:44:09+22:14"})
    assert resp.status_code == 200, resp.content
    resp = client.get(path, {"until": "2030-01-01T00:00:00-23:59"})
    assert resp.status_code == 200, resp.content
    # Past the calendar once in UTC: a field error, not a crash.
    resp = client.get(path, {"since": "0001-01-01T00:00:00+05:00"})
    assert resp.status_code == 400 and "since" in resp.json()


def test_the_utc_conversion_keeps_the_instant(client: APIClient, admin_user: User) -> None:
    record_audit(actor=admin_user, action=AuditAction.CREATE, obj=admin_user, after={})
    # 22:14 ahead of UTC, an hour from now: the event (now) is before it, not after.
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).astimezone(
        dt.timezone(dt.timedelta(hours=22, minutes=14))
    )
    assert client.get("/api/audit/", {"since": later.isoformat()}).json()["count"] == 0
    assert client.get("/api/audit/", {"until": later.isoformat()}).json()["count"] == 1


@pytest.mark.parametrize(
    ("path", "param"), [("/api/routing/usage/", "tenant_id"), ("/api/routing/traffic/", "minutes")]
)
def test_a_unicode_digit_int_refuses_is_a_400(client: APIClient, path: str, param: str) -> None:
    resp = client.get(path, {param: "²"})  # str.isdigit() says yes, int() says no
    assert resp.status_code == 400 and param in resp.json()


def test_a_nul_in_a_text_filter_is_a_400(client: APIClient) -> None:
    model = Model.objects.create(name="nul")
    version = ModelVersion.objects.create(
        model=model, revision="r", source_kind="directory", source_path="/m"
    )
    resp = client.get(f"/api/model-versions/{version.pk}/verifications/", {"host_name": "a\x00b"})
    assert resp.status_code == 400 and resp.json() == {"host_name": ["Null characters are not allowed."]}
