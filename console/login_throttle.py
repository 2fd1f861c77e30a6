"""Failed console sign-ins counted per username and per source address, in Redis (docs/security.md).

Counting in Redis makes the limit hold across every web process. A window starts at the first failure
and lasts LOGIN_FAILURE_WINDOW_SECONDS; past the limit of either counter, sign-in is refused with 429
until the window ends, even with the right password, so guessing gains nothing. A successful sign-in
clears its username's counter (the address's stays: one address guessing many usernames is the case it
is for). Usernames are hashed in key names: any string a client sends is bounded and never stored.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

from django.conf import settings
from django.http import HttpRequest

from core.redis_client import get_redis, key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Refusal:
    """Sign-in is refused for `retry_after` more seconds; `by` is "username" or "address"."""

    by: str
    retry_after: int


def client_address(request: HttpRequest) -> str:
    header = settings.LOGIN_CLIENT_ADDRESS_HEADER
    if header:
        forwarded = request.headers.get(header, "")
        parts = [p.strip() for p in forwarded.split(",") if p.strip()]
        if parts:
            return parts[-1][:64]
    return str(request.META.get("REMOTE_ADDR") or "unknown")[:64]


def _keys(username: str, address: str) -> tuple[str, str]:
    digest = hashlib.sha256(username.strip().lower().encode("utf-8", "replace")).hexdigest()[:32]
    return key("login-fail", "user", digest), key("login-fail", "addr", address)


def refusal(username: str, address: str) -> Refusal | None:
    """Whether sign-in is refused now. Redis unreachable: not refused (and logged), so a Redis outage
    does not lock every operator out of the console."""
    user_key, addr_key = _keys(username, address)
    try:
        pipe = get_redis().pipeline(transaction=False)
        for name in (user_key, addr_key):
            pipe.get(name)
            pipe.ttl(name)
        user_count, user_ttl, addr_count, addr_ttl = pipe.execute()
    except Exception as exc:
        log.warning("login throttle: Redis unavailable, sign-in not throttled (%s)", type(exc).__name__)
        return None
    if int(user_count or 0) >= settings.LOGIN_MAX_FAILURES_PER_USERNAME:
        return Refusal("username", max(1, int(user_ttl)))
    if int(addr_count or 0) >= settings.LOGIN_MAX_FAILURES_PER_ADDRESS:
        return Refusal("address", max(1, int(addr_ttl)))
    return None


def record_failure(username: str, address: str) -> None:
    window = settings.LOGIN_FAILURE_WINDOW_SECONDS
    try:
        pipe = get_redis().pipeline(transaction=True)
        for name in _keys(username, address):
            pipe.incr(name)
            pipe.expire(name, window, nx=True)  # the window runs from the first failure
        pipe.execute()
    except Exception as exc:
        log.warning("login throttle: Redis unavailable, failure not counted (%s)", type(exc).__name__)


def record_success(username: str, address: str) -> None:
    user_key, _ = _keys(username, address)
    try:
        get_redis().delete(user_key)
    except Exception as exc:
        log.warning("login throttle: Redis unavailable, counter not cleared (%s)", type(exc).__name__)
