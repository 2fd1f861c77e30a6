"""The shared key record cannot go stale: a copy read from the database before a revocation is not
written back after it, and a copy written before a tenant change is ignored after it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
import redis.asyncio as aioredis
from django.conf import settings

from console.services import revoke_api_key
from core.redis_client import get_redis, key_cache_record, publish_config_change
from routing.proxy.app import Proxy
from routing.proxy.config import KeyInfo, load_key
from tests.routing.conftest import make_tenant_key

pytestmark = pytest.mark.django_db(transaction=True)
T = TypeVar("T")


def _with_proxy(step: Callable[[Proxy], Awaitable[T]]) -> T:
    """Run one step against a proxy's Redis side (database reads stay in the test's own thread)."""

    async def run() -> T:
        proxy = Proxy()
        proxy.attach_redis(aioredis.Redis.from_url(settings.REDIS_URL))
        try:
            return await step(proxy)
        finally:
            assert proxy.redis is not None
            await proxy.redis.aclose()
            proxy.db.shutdown(wait=False)

    return asyncio.run(run())


def _lookup(digest: str) -> tuple[KeyInfo | None, str | None]:
    return _with_proxy(lambda p: p.shared_key_lookup(digest))


def _write_back(digest: str, info: KeyInfo, generation: str) -> bool:
    return _with_proxy(lambda p: p.shared_key_write_back(digest, info, generation))


def test_write_back_after_revocation_is_refused() -> None:
    tk = make_tenant_key()
    digest = tk.api_key.hashed_key
    cached, generation = _lookup(digest)
    assert cached is None and generation is not None  # a miss: the proxy goes to the database
    stale = load_key(digest)
    assert stale is not None and not stale.revoked

    revoke_api_key(tk.api_key, actor=None)  # commits, then bumps the generation and publishes
    assert _write_back(digest, stale, generation) is False
    assert get_redis().get(key_cache_record(digest)) is None
    assert _lookup(digest)[0] is None

    # A read that starts after the revocation may share what it read: the key, revoked.
    cached, fresh_generation = _lookup(digest)
    assert cached is None and fresh_generation is not None and fresh_generation != generation
    fresh = load_key(digest)
    assert fresh is not None and fresh.revoked
    assert _write_back(digest, fresh, fresh_generation) is True
    shared = _lookup(digest)[0]
    assert shared is not None and shared.revoked and shared.hashed_key == digest


def test_record_written_before_a_tenant_change_is_ignored() -> None:
    tk = make_tenant_key()
    digest = tk.api_key.hashed_key
    _, generation = _lookup(digest)
    assert generation is not None
    info = load_key(digest)
    assert info is not None
    assert _write_back(digest, info, generation) is True
    assert _lookup(digest)[0] == info

    tk.tenant.is_active = False
    tk.tenant.save(update_fields=["is_active"])
    publish_config_change("tenant", id=tk.tenant.pk)  # no key digest in it: only the generation moves
    assert get_redis().get(key_cache_record(digest)) is not None
    assert _lookup(digest)[0] is None
