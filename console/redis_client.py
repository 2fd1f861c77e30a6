"""One shared Redis connection pool per process, and the key names the product writes."""

from __future__ import annotations

import functools
import json
from typing import Any

import redis
from django.conf import settings


@functools.cache
def get_redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)


def key(*parts: str) -> str:
    """A Redis key under this deployment's prefix."""
    return settings.REDIS_KEY_PREFIX + ":".join(parts)


CONFIG_CHANNEL = "config"


def publish_config_change(kind: str, **payload: Any) -> None:
    """Tell every proxy process that config of `kind` changed, once the current transaction commits.

    Proxies drop their cached copy on this message, so a revoked key stops working everywhere
    within one round trip instead of after a TTL.
    """
    from django.db import transaction

    message = json.dumps({"kind": kind, **payload})

    def send() -> None:
        try:
            get_redis().publish(key(CONFIG_CHANNEL), message)
        except redis.RedisError:
            # Proxies also poll a config version, so a missed publish is healed at their next refresh.
            get_redis.cache_clear()

    transaction.on_commit(send)
