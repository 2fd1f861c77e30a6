"""Domain logic for tenants, API keys, quotas and the audit trail. Views and tasks call these."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.choices import AuditAction
from console.models import ApiKey, AuditEvent, Tenant, User
from console.redis_client import publish_config_change

KEY_PREFIX = "ick_"
VISIBLE_PREFIX_LEN = 12
SECRET_FIELD_NAMES = frozenset(
    {"key", "raw_key", "secret", "hashed_key", "password", "api_key", "engine_api_key"}
)
REDACTED = "[redacted]"


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
    raw = KEY_PREFIX + secrets.token_urlsafe(32)
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


def redact(data: Any) -> Any:
    """A copy of `data` with every secret-looking field replaced, at any depth."""
    if isinstance(data, Mapping):
        return {k: (REDACTED if k in SECRET_FIELD_NAMES else redact(v)) for k, v in data.items()}
    if isinstance(data, list):
        return [redact(v) for v in data]
    return data


def record_audit(
    *,
    actor: User | None,
    action: str,
    obj: Any,
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
    object_type: str | None = None,
) -> AuditEvent:
    """Write one audit event; before/after go through `redact` so no secret is ever stored."""
    actor_user = actor if actor is not None and getattr(actor, "pk", None) else None
    return AuditEvent.objects.create(
        actor=actor_user,
        actor_name=actor_user.get_username() if actor_user else "system",
        action=action,
        object_type=object_type or obj._meta.label_lower,
        object_id=str(getattr(obj, "pk", "") or ""),
        object_repr=str(obj)[:200],
        before=redact(dict(before)) if before is not None else None,
        after=redact(dict(after)) if after is not None else None,
    )
