"""A tenant created through the API starts with the default quota (settings), and the limits it names
replace the defaults; tenants that already exist keep what they have."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from pytest_django.fixtures import Settings
from rest_framework.test import APIClient

from console.models import Quota, Tenant
from tests.console.factories import make_tenant

pytestmark = pytest.mark.django_db

DEFAULTS = {
    "requests_per_minute": 30,
    "tokens_per_minute": 40_000,
    "max_concurrent_requests": 4,
    "daily_token_budget": 500_000,
    "max_input_tokens": None,
    "max_output_tokens": 1024,
}


@pytest.fixture(autouse=True)
def defaults(settings: Settings) -> None:
    settings.DEFAULT_TENANT_QUOTA = DEFAULTS


def test_the_defaults_are_readable_by_the_console(viewer_client: APIClient) -> None:
    resp = viewer_client.get("/api/tenants/defaults/")
    assert resp.status_code == 200
    assert resp.json() == {"quota": DEFAULTS}


def test_a_new_tenant_gets_the_default_quota(admin_client: APIClient) -> None:
    resp = admin_client.post("/api/tenants/", {"name": "fresh"}, format="json")
    assert resp.status_code == 201, resp.content
    assert resp.json()["quota"] == DEFAULTS
    assert Quota.objects.get(tenant__name="fresh").limits() == DEFAULTS


def test_limits_the_request_names_replace_the_defaults(admin_client: APIClient) -> None:
    resp = admin_client.post(
        "/api/tenants/",
        {"name": "tuned", "quota": {"requests_per_minute": 600, "daily_token_budget": None}},
        format="json",
    )
    assert resp.status_code == 201, resp.content
    assert Quota.objects.get(tenant__name="tuned").limits() == {
        **DEFAULTS,
        "requests_per_minute": 600,
        "daily_token_budget": None,
    }


def test_the_dialogs_limits_are_stored_as_sent(admin_client: APIClient) -> None:
    # The console's dialog sends every limit, prefilled with the defaults and edited: an emptied box is null.
    sent = {**DEFAULTS, "tokens_per_minute": 9000, "max_concurrent_requests": None}
    resp = admin_client.post("/api/tenants/", {"name": "dialog", "quota": sent}, format="json")
    assert resp.status_code == 201, resp.content
    assert resp.json()["quota"] == sent
    assert Quota.objects.get(tenant__name="dialog").limits() == sent


def test_an_explicit_null_quota_means_no_limits(admin_client: APIClient) -> None:
    resp = admin_client.post("/api/tenants/", {"name": "open", "quota": None}, format="json")
    assert resp.status_code == 201, resp.content
    assert resp.json()["quota"] is None
    assert not Quota.objects.filter(tenant__name="open").exists()


def test_bad_limits_are_field_errors_and_nothing_is_written(admin_client: APIClient) -> None:
    resp = admin_client.post(
        "/api/tenants/",
        {"name": "bad", "quota": {"requests_per_minute": "lots", "tokens_per_minute": -5}},
        format="json",
    )
    assert resp.status_code == 400
    errors = resp.json()["quota"]
    assert errors["requests_per_minute"] == ["A valid integer is required."]
    assert "tokens_per_minute" in errors
    assert not Tenant.objects.filter(name="bad").exists()


def test_existing_tenants_keep_their_quota(admin_client: APIClient) -> None:
    older = make_tenant("older")  # made before: no quota
    limited = make_tenant("limited", requests_per_minute=5)
    admin_client.post("/api/tenants/", {"name": "newer"}, format="json")
    assert not Quota.objects.filter(tenant=older).exists()
    assert Quota.objects.get(tenant=limited).limits() == {
        **{name: None for name in DEFAULTS},
        "requests_per_minute": 5,
    }
    # Editing an old tenant does not bring the defaults in either.
    admin_client.patch(f"/api/tenants/{older.pk}/", {"description": "edited"}, format="json")
    assert not Quota.objects.filter(tenant=older).exists()


def test_defaults_all_unset_create_no_quota(admin_client: APIClient, settings: Settings) -> None:
    settings.DEFAULT_TENANT_QUOTA = {name: None for name in DEFAULTS}
    admin_client.post("/api/tenants/", {"name": "unlimited"}, format="json")
    assert not Quota.objects.filter(tenant__name="unlimited").exists()


def _admin_form(name: str, quota: dict[str, str] | None = None) -> dict[str, str]:
    """The add-tenant form of Django's admin as the browser posts it, with its quota inline."""
    form = {
        "name": name,
        "description": "",
        "is_active": "on",
        "quota-TOTAL_FORMS": "1" if quota is not None else "0",
        "quota-INITIAL_FORMS": "0",
        "quota-MIN_NUM_FORMS": "0",
        "quota-MAX_NUM_FORMS": "1",
    }
    for field, value in (quota or {}).items():
        form[f"quota-0-{field}"] = value
    return form


def test_a_tenant_added_in_django_admin_gets_the_default_quota() -> None:
    superuser = get_user_model().objects.create_superuser("root-admin", "root@example.invalid", "pw-1234567")
    client = Client()
    client.force_login(superuser)
    resp = client.post("/django-admin/console/tenant/add/", _admin_form("from-admin"))
    assert resp.status_code == 302, resp.content.decode()[:2000]
    assert Quota.objects.get(tenant__name="from-admin").limits() == DEFAULTS

    # Limits typed into the inline are what it keeps (blank ones are no limit, as the admin shows them).
    typed = {
        "requests_per_minute": "7",
        "tokens_per_minute": "",
        "max_concurrent_requests": "",
        "daily_token_budget": "",
        "max_input_tokens": "",
        "max_output_tokens": "",
    }
    resp = client.post("/django-admin/console/tenant/add/", _admin_form("typed-limits", typed))
    assert resp.status_code == 302, resp.content.decode()[:2000]
    assert Quota.objects.get(tenant__name="typed-limits").limits()["requests_per_minute"] == 7

    # Saving an existing tenant without a quota does not give it one.
    bare = Tenant.objects.create(name="bare")
    form = _admin_form("bare")
    resp = client.post(f"/django-admin/console/tenant/{bare.pk}/change/", form)
    assert resp.status_code == 302, resp.content.decode()[:2000]
    assert not Quota.objects.filter(tenant=bare).exists()
