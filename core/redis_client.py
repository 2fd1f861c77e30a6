"""One shared Redis connection pool per process, and the key names the product writes."""

from __future__ import annotations

import functools
import json
from typing import Any

import redis
from django.conf import settings
from django.db import transaction


@functools.cache
def get_redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


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
