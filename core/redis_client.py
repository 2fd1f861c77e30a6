"""One shared Redis connection pool per process, and the key names the product writes.

Every client made here retries a call that failed with a connection error once, on a fresh connection:
after a Redis restart each pooled connection is dead, and without the retry every one of them would
fail one request (seconds or minutes later, whenever it is next checked out). A call that fails again
fails for good: Redis is down, and the caller's degraded mode applies. Loss and recovery are logged
once each per process and link (`RedisLink`), not once per call.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis
import redis.asyncio as aioredis
from django.conf import settings
from django.db import transaction
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

log = logging.getLogger("core.redis")
T = TypeVar("T")
_LOST = (RedisConnectionError, RedisTimeoutError)


class RedisLink:
    """Whether this process reaches Redis over one named link; logs the loss and the recovery once each."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.down_since: float | None = None
        self._lock = threading.Lock()

    def lost(self, error: BaseException) -> None:
        if self.down_since is not None:
            return
        with self._lock:
            if self.down_since is None:
                self.down_since = time.monotonic()
                log.warning(
                    "Redis (%s) unreachable: %s: %s. Calls fail until it is back.",
                    self.name,
                    type(error).__name__,
                    error,
                )

    def ok(self) -> None:
        if self.down_since is None:  # the success path: one attribute read
            return
        with self._lock:
            if self.down_since is not None:
                down = time.monotonic() - self.down_since
                self.down_since = None
                log.warning("Redis (%s) reachable again after %.2f s.", self.name, down)


_LINKS: dict[str, RedisLink] = {}


def redis_link(name: str) -> RedisLink:
    """The process-wide state of link `name` (redis-py deep-copies its Retry per connection)."""
    found = _LINKS.get(name)
    if found is None:
        found = _LINKS.setdefault(name, RedisLink(name))
    return found


class RetryOnce(Retry):
    """redis-py's Retry: once, at once, on a connection error; loss and recovery reported to a RedisLink."""

    def __init__(self, link: str) -> None:
        super().__init__(NoBackoff(), 1, supported_errors=(RedisConnectionError,))
        self.link = link

    def call_with_retry(self, do: Callable[[], T], fail: Any, *args: Any, **kwargs: Any) -> T:
        try:
            result = super().call_with_retry(do, fail, *args, **kwargs)
        except _LOST as exc:
            redis_link(self.link).lost(exc)
            raise
        redis_link(self.link).ok()
        return result


class AsyncRetryOnce(AsyncRetry):
    """The asyncio twin of RetryOnce."""

    def __init__(self, link: str) -> None:
        super().__init__(NoBackoff(), 1, supported_errors=(RedisConnectionError,))
        self.link = link

    async def call_with_retry(
        self, do: Callable[[], Awaitable[T]], fail: Any, *args: Any, **kwargs: Any
    ) -> T:
        try:
            result = await super().call_with_retry(do, fail, *args, **kwargs)
        except _LOST as exc:
            redis_link(self.link).lost(exc)
            raise
        redis_link(self.link).ok()
        return result


def async_redis(
    url: str, *, link: str = "proxy", max_connections: int | None = None, **kwargs: Any
) -> aioredis.Redis:
    """An asyncio client whose calls are retried once on a fresh connection after a connection error.

    With `max_connections`, a call past that many at once waits for a free connection (up to its
    socket timeout) instead of failing: redis-py's default pool raises at 100, which a burst of
    hundreds of agent syncs in one event loop reaches.
    """
    options: dict[str, Any] = {
        "retry": AsyncRetryOnce(link),
        "retry_on_error": [RedisConnectionError],
        **kwargs,
    }
    if max_connections is None:
        return aioredis.Redis.from_url(url, **options)
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=kwargs.get("socket_timeout") or 5, **options
    )
    return aioredis.Redis(connection_pool=pool)


@functools.cache
def get_redis() -> redis.Redis:
    return redis.Redis.from_url(
        settings.REDIS_URL,
        socket_timeout=2,
        socket_connect_timeout=2,
        retry=RetryOnce("shared"),
        retry_on_error=[RedisConnectionError],
    )


def key(*parts: str) -> str:
    """A Redis key under this deployment's prefix."""
    return settings.REDIS_KEY_PREFIX + ":".join(parts)


CONFIG_CHANNEL = "config"
# Changes that invalidate the proxies' shared copy of API-key records (see routing/proxy/config.py).
KEY_CACHE_KINDS = frozenset({"api_key", "tenant", "quota"})


def key_cache_generation() -> str:
    """The counter every key/tenant/quota change bumps; key records stamped with an older one are stale."""
    return key("apikeys", "gen")


def key_cache_record(digest: str) -> str:
    """The shared record of the key with this HMAC digest (never the raw key)."""
    return key("apikeys", "rec", digest)


def publish_config_change(kind: str, **payload: Any) -> None:
    """Tell every proxy process that config of `kind` changed, once the current transaction commits.

    Proxies drop their cached copy on this message, so a revoked key stops working everywhere
    within one round trip instead of after a TTL.
    """
    message = json.dumps({"kind": kind, **payload})

    def send() -> None:
        try:
            with get_redis().pipeline(transaction=True) as pipe:
                if kind in KEY_CACHE_KINDS:
                    # Bump the generation before anyone hears of the change: a proxy that read the key
                    # from the database before this commit can then no longer write its copy back.
                    pipe.incr(key_cache_generation())
                    if isinstance(payload.get("hashed_key"), str):
                        pipe.delete(key_cache_record(payload["hashed_key"]))
                pipe.publish(key(CONFIG_CHANNEL), message)
                pipe.execute()
        except redis.RedisError:
            # Proxies also poll a config version, so a missed publish is healed at their next refresh.
            get_redis.cache_clear()

    transaction.on_commit(send)
