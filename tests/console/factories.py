"""Small builders for console objects used across tests."""

from __future__ import annotations

from console.models import Quota, Tenant
from console.services import IssuedKey, issue_api_key


def make_tenant(name: str = "acme", **quota: int) -> Tenant:
    tenant = Tenant.objects.create(name=name)
    if quota:
        Quota.objects.create(tenant=tenant, **quota)
    return tenant


def make_key(tenant: Tenant, name: str = "ci key", scopes: list[str] | None = None) -> IssuedKey:
    return issue_api_key(tenant=tenant, name=name, scopes=scopes)
