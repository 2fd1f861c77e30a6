"""API keys: the secret is shown once, only a keyed hash is stored, revoke is idempotent."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import logging

import pytest
from django.conf import settings
from django.utils import timezone
from rest_framework.test import APIClient

from console.models import ApiKey
from console.services import find_api_key, hash_api_key
from core.models import AuditEvent
from tests.console.factories import make_alias, make_key, make_tenant

pytestmark = pytest.mark.django_db


def test_create_shows_key_once_and_stores_only_hmac(
    admin_client: APIClient, caplog: pytest.LogCaptureFixture
) -> None:
    tenant = make_tenant()
    make_alias("llama-3-8b")
    caplog.set_level(logging.DEBUG)
    resp = admin_client.post(
        "/api/keys/", {"tenant": tenant.pk, "name": "prod", "scopes": ["llama-3-8b"]}, format="json"
    )
    assert resp.status_code == 201, resp.content
    raw = resp.json()["key"]
    api_key = ApiKey.objects.get(pk=resp.json()["id"])
    expected = hmac.new(settings.API_KEY_HMAC_SECRET.encode(), raw.encode(), hashlib.sha256).hexdigest()
    assert api_key.hashed_key == expected
    assert api_key.prefix == raw[:12] and raw.startswith(api_key.prefix)
    assert api_key.scopes == ["llama-3-8b"]
    # The raw key is nowhere else: not in the row, not in the audit log, not in logs, not on a later read.
    row = {f.attname: getattr(api_key, f.attname) for f in ApiKey._meta.fields}
    assert raw not in json.dumps(row, default=str)
    assert raw not in json.dumps(list(AuditEvent.objects.values("before", "after", "object_repr")))
    assert raw not in caplog.text
    detail = admin_client.get(f"/api/keys/{api_key.pk}/").json()
    assert "key" not in detail and "hashed_key" not in detail
    assert raw not in json.dumps(admin_client.get("/api/keys/").json())


def test_find_api_key_matches_only_the_exact_key() -> None:
    issued = make_key(make_tenant())
    assert find_api_key(issued.raw_key) == issued.api_key
    assert find_api_key(issued.raw_key + "x") is None
    assert find_api_key(issued.raw_key[:-1]) is None
    assert hash_api_key(issued.raw_key) != hash_api_key(issued.raw_key.upper())


def test_revoke_is_idempotent_and_audited_once(admin_client: APIClient) -> None:
    issued = make_key(make_tenant())
    first = admin_client.post(f"/api/keys/{issued.api_key.pk}/revoke/")
    second = admin_client.post(f"/api/keys/{issued.api_key.pk}/revoke/")
    assert first.status_code == second.status_code == 200
    assert first.json()["revoked_at"] == second.json()["revoked_at"] is not None
    assert first.json()["is_active"] is False
    assert AuditEvent.objects.filter(action="revoke", object_id=str(issued.api_key.pk)).count() == 1


def test_expiry_in_the_past_is_refused(admin_client: APIClient) -> None:
    tenant = make_tenant()
    past = (timezone.now() - dt.timedelta(minutes=1)).isoformat()
    resp = admin_client.post(
        "/api/keys/", {"tenant": tenant.pk, "name": "old", "expires_at": past}, format="json"
    )
    assert resp.status_code == 400
    assert "expires_at" in resp.json()
    assert not ApiKey.objects.exists()


def test_expired_key_is_not_active() -> None:
    issued = make_key(make_tenant())
    ApiKey.objects.filter(pk=issued.api_key.pk).update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert ApiKey.objects.get(pk=issued.api_key.pk).is_active is False


def test_key_quota_override_and_bad_scopes(admin_client: APIClient) -> None:
    tenant = make_tenant(requests_per_minute=100)
    resp = admin_client.post(
        "/api/keys/",
        {"tenant": tenant.pk, "name": "k", "quota_override": {"requests_per_minute": 5}},
        format="json",
    )
    assert resp.status_code == 201
    assert ApiKey.objects.get(pk=resp.json()["id"]).quota_override.requests_per_minute == 5
    resp = admin_client.post(
        "/api/keys/", {"tenant": tenant.pk, "name": "k2", "scopes": ["a", "a"]}, format="json"
    )
    assert resp.status_code == 400 and "scopes" in resp.json()


def test_keys_cannot_be_deleted_or_moved(admin_client: APIClient) -> None:
    issued = make_key(make_tenant("one"))
    other = make_tenant("two")
    assert admin_client.delete(f"/api/keys/{issued.api_key.pk}/").status_code == 405
    resp = admin_client.patch(f"/api/keys/{issued.api_key.pk}/", {"tenant": other.pk}, format="json")
    assert resp.status_code == 400
    assert ApiKey.objects.get(pk=issued.api_key.pk).tenant.name == "one"


def test_list_filters_by_tenant_and_active(admin_client: APIClient) -> None:
    a, b = make_tenant("a"), make_tenant("b")
    ka = make_key(a)
    make_key(b)
    admin_client.post(f"/api/keys/{ka.api_key.pk}/revoke/")
    assert admin_client.get(f"/api/keys/?tenant={a.pk}").json()["count"] == 1
    assert admin_client.get("/api/keys/?active=true").json()["count"] == 1
    assert admin_client.get("/api/keys/?active=false").json()["results"][0]["id"] == ka.api_key.pk
