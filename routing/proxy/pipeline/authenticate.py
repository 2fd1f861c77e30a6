"""Step 1, authenticate: the bearer key -> KeyInfo, from the key cache (routing/proxy/keycache.py).
The pipeline awaits `authenticate` itself (no step wrapper: one coroutine less per request)."""

from __future__ import annotations

import hmac
import time

from console.services import hash_api_key
from routing.proxy import bearer
from routing.proxy.config import KeyInfo
from routing.proxy.errors import ProxyError, unauthorized
from routing.proxy.keycache import KeyCache
from routing.proxy.pipeline.context import Scope


def bearer_token(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() != "bearer":
                return None
            return token.strip() or None
    return None


async def authenticate(scope: Scope, keys: KeyCache) -> KeyInfo:
    """The caller's key, or the 401/403/503 ProxyError that says why not."""
    raw = bearer_token(scope)
    if raw is None:
        raise unauthorized("Missing API key. Send 'Authorization: Bearer <key>'.")
    problem = bearer.malformed(raw)
    if problem is not None:
        keys.failed_auth.check(scope)
        raise await keys.failed_auth.failed(scope, unauthorized(problem))
    digest = hash_api_key(raw)
    now = time.monotonic()
    cached = keys.keys.get(digest)
    # Without a live subscription a cached key is trusted for one second only, so revocation still
    # lands within a second (one indexed query per key per second instead of a push).
    if cached is not None and (keys.subscribed or now - cached[1] < 1.0):
        info = cached[0]
    else:
        keys.failed_auth.check(scope)
        if keys.negative_until(digest) > now:
            raise await keys.failed_auth.failed(scope, unauthorized())
        info_or_none = await keys.load(digest)
        if info_or_none is None:
            keys.remember_unknown(digest, now)
            raise await keys.failed_auth.failed(scope, unauthorized())
        info = info_or_none
    # The dict lookup is by digest; compare once more in constant time before trusting it.
    if not hmac.compare_digest(info.hashed_key, digest):
        raise unauthorized()
    if info.revoked:
        raise unauthorized("This API key has been revoked.")
    if info.expires_at is not None and info.expires_at <= time.time():
        raise unauthorized("This API key has expired.")
    if not info.tenant_active:
        raise ProxyError(403, "This tenant is disabled.", type="permission_error", code="tenant_disabled")
    return info
