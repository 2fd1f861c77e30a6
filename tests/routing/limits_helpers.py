"""KeyInfo builders for limiter tests (no database needed: the limiter only reads limits)."""

from __future__ import annotations

from routing.proxy.config import KeyInfo, Limits


def key_info(tenant_id: int = 1, key_id: int = 1, **tenant_limits: int) -> KeyInfo:
    return KeyInfo(
        id=key_id,
        prefix="ick_test",
        hashed_key="0" * 64,
        tenant_id=tenant_id,
        tenant_name="t",
        tenant_active=True,
        log_prompts=False,
        scopes=frozenset(),
        expires_at=None,
        revoked=False,
        tenant_limits=Limits(**tenant_limits),
        key_limits=Limits(),
    )
