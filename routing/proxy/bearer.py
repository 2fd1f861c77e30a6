"""Bearer strings the proxy refuses before any lookup, and failed attempts throttled per source address.

A string that cannot be a key (console/services.py issues `ick_` + 43 URL-safe base64 characters) is
refused from its shape alone: no hash, no cache, no database query. Each failed attempt (a malformed
key, or a well-formed one that matches no key) counts against the caller's address in Redis, shared by
every proxy process; past `PROXY_AUTH_FAILURES_PER_WINDOW` in one window the address gets 429 with
`Retry-After` until the window ends, before any lookup. The success path does no extra work: a known
key (cached in this process) is never checked against the throttle, and nothing is counted for it.
"""

from __future__ import annotations

import logging
import math
import re
import time
from typing import Any

import redis.asyncio as aioredis

from console.services import KEY_LENGTH, KEY_PREFIX
from core.redis_client import key as rkey
from routing.proxy.errors import ProxyError, rate_limited

log = logging.getLogger("routing.proxy")

_BODY = re.compile(r"[A-Za-z0-9_-]+")
# The whole shape in one C call: the success path's only cost here.
_KEY = re.compile(re.escape(KEY_PREFIX) + f"[A-Za-z0-9_-]{{{KEY_LENGTH - len(KEY_PREFIX)}}}")
# Fixed window per address: the first failure starts it; the count and the time left come back together.
COUNT_LUA = """
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[1]); ttl = tonumber(ARGV[1]) end
return {n, ttl}
"""
LOCAL_ADDRESSES_MAX = 10_000


def malformed(raw: str) -> str | None:
    """What is wrong with `raw` as an inferchain key, or None if it has a key's shape. Never echoes it."""
    if _KEY.fullmatch(raw) is not None:
        return None
    if not raw.startswith(KEY_PREFIX):
        return (
            f"Malformed API key: inferchain keys start with '{KEY_PREFIX}'. Send the key the console showed."
        )
    if len(raw) != KEY_LENGTH:
        return (
            f"Malformed API key: inferchain keys are {KEY_LENGTH} characters long, this one has {len(raw)}. "
            "Check that the whole key was copied."
        )
    if not _BODY.fullmatch(raw, len(KEY_PREFIX)):
        return (
            f"Malformed API key: after '{KEY_PREFIX}' a key has only letters, digits, '-' and '_'. "
            "Check for quotes or spaces copied with it."
        )
    return None


def source_address(scope: Any) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


class FailedAuthThrottle:
    """Counts failed key attempts per source address (Redis, shared) and refuses an address over the limit."""

    def __init__(self, limit: int, window_s: float) -> None:
        self.limit = limit
        self.window_ms = max(1, int(window_s * 1000))
        self.redis: aioredis.Redis | None = None
        self._count: Any = None
        # address -> monotonic time its block ends (this process learnt it from a count over the limit).
        self.blocked: dict[str, float] = {}
        # Redis unreachable: a per-process window instead, address -> (count, window end).
        self._local: dict[str, tuple[int, float]] = {}

    def attach(self, client: aioredis.Redis) -> None:
        self.redis = client
        self._count = client.register_script(COUNT_LUA)

    def check(self, scope: Any) -> None:
        """Raise the 429 if the caller's address is blocked (before any key lookup). One dict read."""
        if not self.blocked:
            return
        address = source_address(scope)
        until = self.blocked.get(address)
        if until is None:
            return
        left = until - time.monotonic()
        if left <= 0:
            del self.blocked[address]
            return
        raise self._too_many(left)

    async def failed(self, scope: Any, err: ProxyError) -> ProxyError:
        """Count one failed attempt; the error to answer with: `err`, or a 429 once over the limit."""
        if self.limit <= 0:
            return err
        address = source_address(scope)
        count, left_ms = await self._incr(address)
        if count <= self.limit:
            return err
        if len(self.blocked) > LOCAL_ADDRESSES_MAX:
            self.blocked.clear()
        if address not in self.blocked:
            log.warning(
                "proxy: %d failed API-key attempts from %s in one window; refusing it", count, address
            )
        self.blocked[address] = time.monotonic() + left_ms / 1000
        return self._too_many(left_ms / 1000)

    async def _incr(self, address: str) -> tuple[int, float]:
        if self._count is not None:
            try:
                n, ttl = await self._count(keys=[rkey("authfail", address)], args=[self.window_ms])
                return int(n), float(ttl)
            except Exception:  # Redis down: fall back to counting in this process
                pass
        now = time.monotonic()
        count, end = self._local.get(address, (0, 0.0))
        if end <= now:
            if len(self._local) > LOCAL_ADDRESSES_MAX:
                self._local.clear()
            count, end = 0, now + self.window_ms / 1000
        self._local[address] = (count + 1, end)
        return count + 1, (end - now) * 1000

    def _too_many(self, left_s: float) -> ProxyError:
        retry = max(1, math.ceil(left_s))
        return rate_limited(
            f"Too many requests with an invalid API key from this address: more than {self.limit} in "
            f"{self.window_ms / 1000:g} s. Retry after {retry} s, with a valid key.",
            code="too_many_invalid_keys",
            headers=[(b"retry-after", str(retry).encode())],
        )
