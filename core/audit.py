"""The audit trail: one event per administrative change, with secrets redacted before they are stored."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser

from core.models import AuditEvent

SECRET_FIELD_NAMES = frozenset(
    {"key", "raw_key", "secret", "hashed_key", "password", "api_key", "engine_api_key"}
)
REDACTED = "[redacted]"


def redact(data: Any) -> Any:
    """A copy of `data` with every secret-looking field replaced, at any depth."""
    if isinstance(data, Mapping):
        return {k: (REDACTED if k in SECRET_FIELD_NAMES else redact(v)) for k, v in data.items()}
    if isinstance(data, list):
        return [redact(v) for v in data]
    return data


def record_audit(
    *,
    actor: AbstractBaseUser | AnonymousUser | None,
    action: str,
    obj: Any,
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
    object_type: str | None = None,
) -> AuditEvent:
    """Write one audit event; before/after go through `redact` so no secret is ever stored.

    `actor` is the signed-in user (request.user), or None for the system.
    """
    actor_user = actor if isinstance(actor, AbstractBaseUser) and actor.pk else None
    return AuditEvent.objects.create(
        actor_id=actor_user.pk if actor_user else None,
        actor_name=actor_user.get_username() if actor_user else "system",
        action=action,
        object_type=object_type or obj._meta.label_lower,
        object_id=str(getattr(obj, "pk", "") or ""),
        object_repr=str(obj)[:200],
        before=redact(dict(before)) if before is not None else None,
        after=redact(dict(after)) if after is not None else None,
    )
