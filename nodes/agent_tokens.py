"""Per-host agent tokens: issued when a host is registered (shown once), rotated and revoked from the
console, checked on every call of the agent channel (/api/agent/).

Stored like API keys: a keyed hash (HMAC-SHA256 with the server's API_KEY_HMAC_SECRET, under a
domain of its own so an agent token can never match an API key) and a short visible prefix.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.audit import record_audit
from core.choices import AuditAction
from nodes import agent_generation
from nodes.models import AgentToken, Host

log = logging.getLogger("nodes.agent_channel")

TOKEN_PREFIX = "ict_"
TOKEN_SECRET_BYTES = 32
VISIBLE_PREFIX_LEN = 12
# last_used_at is a hint for the console, not an access log: written at most this often per token.
LAST_USED_RESOLUTION = timedelta(seconds=60)


def hash_agent_token(raw_token: str) -> str:
    message = b"agent-token:" + raw_token.encode()
    return hmac.new(settings.API_KEY_HMAC_SECRET.encode(), message, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class IssuedAgentToken:
    """A fresh token: `raw_token` exists only in this object and the one response that shows it."""

    token: AgentToken
    raw_token: str


def issue_agent_token(host: Host, *, actor: Any = None) -> IssuedAgentToken:
    """A new token for `host`; any token it had before is revoked (rotation). Audited."""
    raw = TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_SECRET_BYTES)
    with transaction.atomic():
        revoked = _revoke_active(host)
        token = AgentToken.objects.create(
            host=host,
            prefix=raw[:VISIBLE_PREFIX_LEN],
            hashed_token=hash_agent_token(raw),
            created_by=actor if getattr(actor, "is_authenticated", False) else None,
        )
        record_audit(
            actor=actor,
            action=AuditAction.CREATE,
            obj=token,
            object_type="nodes.agenttoken",
            after={"host": host.name, "prefix": token.prefix, "revoked_previous": revoked},
        )
    return IssuedAgentToken(token=token, raw_token=raw)


def revoke_agent_tokens(host: Host, *, actor: Any = None) -> int:
    """Revoke every active token of `host` (its agent is refused from its next call). Audited."""
    with transaction.atomic():
        revoked = _revoke_active(host)
        if revoked:
            record_audit(
                actor=actor,
                action=AuditAction.REVOKE,
                obj=host,
                before={"agent_tokens": revoked},
                after={"agent_tokens": 0},
            )
    return revoked


def _revoke_active(host: Host) -> int:
    # The host's generation moves too: its agent's next sync goes the full path, which reads the token.
    agent_generation.bump([host.name])
    return AgentToken.objects.filter(host=host, revoked_at__isnull=True).update(revoked_at=timezone.now())


def active_token(host: Host) -> AgentToken | None:
    return AgentToken.objects.filter(host=host, revoked_at__isnull=True).first()


class AgentRefused(Exception):
    """A call on the agent channel that is refused; `status` and `code` go into the JSON answer."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def authenticate_agent(authorization: str, host_name: str, remote: str = "") -> Host:
    """The host a bearer token belongs to, when it is that host's active token; else AgentRefused.

    Every refusal is logged with the token's visible prefix only (never the token).
    """
    raw = authorization[7:].strip() if authorization.lower().startswith("bearer ") else ""
    if not raw:
        _refuse_log("no token", host_name, "", remote)
        raise AgentRefused(
            401, "agent_token_missing", "Send the host's agent token as 'Authorization: Bearer'."
        )
    prefix = raw[:VISIBLE_PREFIX_LEN]
    digest = hash_agent_token(raw)
    token = AgentToken.objects.select_related("host").filter(hashed_token=digest).first()
    if token is None or not hmac.compare_digest(token.hashed_token, digest):
        _refuse_log("unknown token", host_name, prefix, remote)
        raise AgentRefused(401, "agent_token_invalid", "Unknown agent token; copy the host's token again.")
    if token.revoked_at is not None:
        _refuse_log("revoked token", host_name, prefix, remote)
        raise AgentRefused(
            401,
            "agent_token_revoked",
            f"This agent token was revoked at {token.revoked_at.isoformat()}; "
            "give the agent the host's current token.",
        )
    if token.host.name != host_name:
        _refuse_log(f"token of host {token.host.name}", host_name, prefix, remote)
        raise AgentRefused(
            403,
            "agent_token_wrong_host",
            f"This token belongs to another host, not {host_name}; each host has its own token.",
        )
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        AgentToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.host


def _refuse_log(why: str, host_name: str, prefix: str, remote: str) -> None:
    log.warning(
        "agent channel refused: %s (host %r, token prefix %r, from %s)", why, host_name, prefix, remote or "?"
    )
