"""The proxy's API-key cache, a long-lived service: in-process dict <- Redis record <- database.

Revocation arrives over pub/sub (`drop_keys`, `clear_keys`); while the subscription is down a cached
key is trusted for one second only. Lookups of one digest are coalesced, and a lookup that began before
a drop never stores what it read (it may predate the revocation that caused the drop).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import redis.asyncio as aioredis
from django.conf import settings

from core.redis_client import key_cache_generation, key_cache_record
from routing.proxy import bearer
from routing.proxy import metrics as m
from routing.proxy.config import (
    WRITE_BACK_LUA,
    KeyInfo,
    key_info_from_record,
    key_record,
    load_key,
    load_keys,
)
from routing.proxy.errors import unavailable

NEGATIVE_CACHE_S = 5.0
NEGATIVE_CACHE_MAX = 10_000

InDb = Callable[..., Awaitable[Any]]


class KeyCache:
    """Keys by digest, the negative cache, the failed-auth throttle and the shared Redis records."""

    def __init__(self, in_db: InDb) -> None:
        self.in_db = in_db
        self.keys: dict[str, tuple[KeyInfo, float]] = {}
        self.negative: dict[str, float] = {}
        self.failed_auth = bearer.FailedAuthThrottle(
            settings.PROXY_AUTH_FAILURES_PER_WINDOW, settings.PROXY_AUTH_FAILURE_WINDOW_SECONDS
        )
        self.loads: dict[str, asyncio.Future[KeyInfo | None]] = {}
        # Bumped whenever cached keys are dropped: a lookup that began before a drop must not store
        # what it read (it may predate the revocation that caused the drop).
        self.epoch = 0
        self.redis: aioredis.Redis | None = None
        self.write_back: Any = None
        # Whether config changes arrive live (the config subscription sets it).
        self.subscribed = False

    def attach(self, client: aioredis.Redis) -> None:
        self.redis = client
        self.write_back = client.register_script(WRITE_BACK_LUA)
        self.failed_auth.attach(client)

    def drop(
        self, *, key_id: int | None = None, digest: str | None = None, tenant_id: int | None = None
    ) -> None:
        self.epoch += 1
        self.loads.clear()  # later requests start fresh lookups instead of joining older ones
        if digest is not None:
            self.keys.pop(digest, None)
            self.negative.pop(digest, None)
        if key_id is not None or tenant_id is not None:
            for d, (info, _) in list(self.keys.items()):
                if info.id == key_id or info.tenant_id == tenant_id:
                    del self.keys[d]

    def clear(self) -> None:
        self.epoch += 1
        self.loads.clear()
        self.keys.clear()

    def negative_until(self, digest: str) -> float:
        return self.negative.get(digest, 0.0)

    def remember_unknown(self, digest: str, now: float) -> None:
        if len(self.negative) > NEGATIVE_CACHE_MAX:
            self.negative.clear()
        self.negative[digest] = now + NEGATIVE_CACHE_S

    async def load(self, digest: str) -> KeyInfo | None:
        """The key behind `digest` from Redis or the database (None: no such key), cached on success."""
        pending = self.loads.get(digest)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[KeyInfo | None] = asyncio.get_running_loop().create_future()
        self.loads[digest] = fut
        epoch = self.epoch
        try:
            info: KeyInfo | None = None
            generation: str | None = None
            # Without a live subscription this process may have missed changes, and Redis is likely
            # the reason: go to the database as before (and write nothing back).
            if self.subscribed:
                info, generation = await self.shared_lookup(digest)
            if info is not None:
                m.KEY_LOOKUPS.labels("redis").inc()
            else:
                info = await self.in_db(load_key, digest)
                m.KEY_LOOKUPS.labels("db").inc()
                if info is not None and generation is not None:
                    await self.shared_write_back(digest, info, generation)
            if info is not None and epoch == self.epoch:
                self.keys[digest] = (info, time.monotonic())
            fut.set_result(info)
            return info
        except Exception as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved
            raise unavailable("Key lookup is unavailable; retry shortly.") from exc
        finally:
            if self.loads.get(digest) is fut:
                del self.loads[digest]

    async def shared_lookup(self, digest: str) -> tuple[KeyInfo | None, str | None]:
        """The key's record from Redis if it is current, and the generation seen (None: Redis failed).

        One round trip reads the generation together with the record; a record stamped with an
        older generation predates some key/tenant change and is ignored. The generation returned is
        what a write-back after a database read must still find.
        """
        if self.redis is None:
            return None, None
        try:
            raw_gen, raw = await self.redis.mget([key_cache_generation(), key_cache_record(digest)])
        except Exception:
            return None, None
        generation = raw_gen.decode() if isinstance(raw_gen, bytes) else str(raw_gen or "0")
        if not raw:
            return None, generation
        try:
            record = orjson.loads(raw)
            if record.get("gen") != generation:
                return None, generation
            return key_info_from_record(record), generation
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            return None, generation

    async def shared_write_back(self, digest: str, info: KeyInfo, generation: str) -> bool:
        """Share a key read from the database, unless a key/tenant change happened since `generation`."""
        if self.write_back is None:
            return False
        ttl_ms = max(1000, int(settings.PROXY_CONFIG_REFRESH_SECONDS * 1000))
        try:
            written = await self.write_back(
                keys=[key_cache_generation(), key_cache_record(digest)],
                args=[generation, orjson.dumps(key_record(info, generation)), ttl_ms],
            )
        except Exception:
            return False  # the next process to miss reads the database too; nothing is wrong
        return bool(written)

    async def revalidate(self) -> None:
        """Re-read every cached key from the database (the periodic safety net behind pub/sub)."""
        ids = list({info.id for info, _ in self.keys.values()})
        epoch = self.epoch
        if not ids:
            return
        fresh: dict[int, KeyInfo] = await self.in_db(load_keys, ids)
        if epoch != self.epoch:
            return  # keys were dropped meanwhile; what was read may predate that
        now = time.monotonic()
        for digest, (info, _) in list(self.keys.items()):
            if info.id in fresh:
                self.keys[digest] = (fresh[info.id], now)
            else:
                del self.keys[digest]
