"""Domain logic for tenants, API keys and quotas. Views and tasks call these."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.models import ApiKey, Quota, Tenant, User
from core.audit import record_audit
from core.choices import AuditAction
from core.redis_client import publish_config_change

KEY_PREFIX = "ick_"
KEY_SECRET_BYTES = 32
# token_urlsafe(32): 32 bytes in unpadded URL-safe base64 (A-Z a-z 0-9 - _) are 43 characters.
KEY_LENGTH = len(KEY_PREFIX) + 43
VISIBLE_PREFIX_LEN = 12


def default_tenant_quota() -> dict[str, int | None]:
    """The limits a tenant created through the API, the console or Django's admin starts with
    (`DEFAULT_TENANT_QUOTA`); None is no limit. Tenants made otherwise (the ORM, the demo seed) start
    with none."""
    return {name: settings.DEFAULT_TENANT_QUOTA.get(name) for name in Quota.LIMIT_FIELDS}


def hash_api_key(raw_key: str) -> str:
    """Keyed hash of a raw key (HMAC-SHA256 with a server-side secret): what the database keeps."""
    return hmac.new(settings.API_KEY_HMAC_SECRET.encode(), raw_key.encode(), hashlib.sha256).hexdigest()


def key_prefix(raw_key: str) -> str:
    return raw_key[:VISIBLE_PREFIX_LEN]


@dataclass(frozen=True)
class IssuedKey:
    """A freshly created key: `raw_key` exists only in this object and the one response that shows it."""

    api_key: ApiKey
    raw_key: str


def issue_api_key(
    *,
    tenant: Tenant,
    name: str,
    scopes: list[str] | None = None,
    expires_at: Any = None,
    created_by: User | None = None,
) -> IssuedKey:
    raw = KEY_PREFIX + secrets.token_urlsafe(KEY_SECRET_BYTES)
    api_key = ApiKey.objects.create(
        tenant=tenant,
        name=name,
        prefix=key_prefix(raw),
        hashed_key=hash_api_key(raw),
        scopes=list(scopes or []),
        expires_at=expires_at,
        created_by=created_by,
    )
    return IssuedKey(api_key=api_key, raw_key=raw)


def revoke_api_key(api_key: ApiKey, *, actor: User | None) -> bool:
    """Revoke a key. Idempotent: returns False (and records nothing) if it was already revoked."""
    with transaction.atomic():
        locked = ApiKey.objects.select_for_update().get(pk=api_key.pk)
        if locked.revoked_at is not None:
            api_key.revoked_at = locked.revoked_at
            return False
        locked.revoked_at = timezone.now()
        locked.save(update_fields=["revoked_at"])
        api_key.revoked_at = locked.revoked_at
        record_audit(
            actor=actor,
            action=AuditAction.REVOKE,
            obj=locked,
            before={"revoked_at": None},
            after={"revoked_at": locked.revoked_at.isoformat()},
        )
        publish_config_change("api_key", id=locked.pk, hashed_key=locked.hashed_key)
    return True


def find_api_key(raw_key: str) -> ApiKey | None:
    """The key whose hash matches `raw_key`; the hash lookup is exact, the final check constant-time."""
    digest = hash_api_key(raw_key)
    candidate = ApiKey.objects.select_related("tenant").filter(hashed_key=digest).first()
    if candidate is None or not hmac.compare_digest(candidate.hashed_key, digest):
        return None
    return candidate
