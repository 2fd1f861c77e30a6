"""Small builders for console objects used across tests."""

from __future__ import annotations

from console.models import Quota, Tenant
from console.services import IssuedKey, issue_api_key
from models_registry.models import Model, ModelAlias, ModelVersion


def make_tenant(name: str = "acme", **quota: int) -> Tenant:
    tenant = Tenant.objects.create(name=name)
    if quota:
        Quota.objects.create(tenant=tenant, **quota)
    return tenant


def make_key(tenant: Tenant, name: str = "ci key", scopes: list[str] | None = None) -> IssuedKey:
    return issue_api_key(tenant=tenant, name=name, scopes=scopes)


def make_alias(name: str) -> ModelAlias:
    """A model alias (with the family and version it needs), as a key's scope may name."""
    version = ModelVersion.objects.create(
        model=Model.objects.create(name=f"model-{name}"),
        revision="fp16",
        source_kind="directory",
        source_path=f"/srv/models/{name}",
    )
    return ModelAlias.objects.create(name=name, active_version=version)
