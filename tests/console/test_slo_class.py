"""SLO classes on tenants and keys: set over the API, checked, and resolved for the proxy as the key's,
else the tenant's, else the configured default."""

from __future__ import annotations

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from console.models import ApiKey
from routing.proxy.config import key_info_from_model, key_info_from_record, key_record
from tests.console.factories import make_key, make_tenant

pytestmark = pytest.mark.django_db


def test_admin_sets_a_tenant_and_a_key_class(admin_client: APIClient) -> None:
    tenant = make_tenant()
    issued = make_key(tenant)
    resp = admin_client.patch(f"/api/tenants/{tenant.pk}/", {"slo_class": "interactive"}, format="json")
    assert resp.status_code == 200 and resp.json()["slo_class"] == "interactive"
    resp = admin_client.patch(f"/api/keys/{issued.api_key.pk}/", {"slo_class": "batch"}, format="json")
    assert resp.status_code == 200 and resp.json()["slo_class"] == "batch"


def test_an_unknown_class_is_a_field_error(admin_client: APIClient) -> None:
    tenant = make_tenant()
    resp = admin_client.patch(f"/api/tenants/{tenant.pk}/", {"slo_class": "urgent"}, format="json")
    assert resp.status_code == 400 and "slo_class" in resp.json()


@override_settings(PROXY_DEFAULT_SLO_CLASS="standard")
def test_the_proxy_takes_the_keys_class_else_the_tenants_else_the_default() -> None:
    tenant = make_tenant()
    key = make_key(tenant).api_key

    def resolved() -> str:
        return key_info_from_model(ApiKey.objects.select_related("tenant").get(pk=key.pk)).slo_class

    assert resolved() == "standard"
    tenant.slo_class = "interactive"
    tenant.save(update_fields=["slo_class"])
    assert resolved() == "interactive"
    key.slo_class = "batch"
    key.save(update_fields=["slo_class"])
    assert resolved() == "batch"
    # The shared (Redis) copy of the record carries it too.
    info = key_info_from_model(ApiKey.objects.select_related("tenant").get(pk=key.pk))
    assert key_info_from_record(key_record(info, "1")).slo_class == "batch"
