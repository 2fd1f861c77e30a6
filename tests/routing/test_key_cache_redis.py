"""A key one proxy process read from the database is resolved by another from Redis, with no query,
and a revocation still reaches both (and a freshly started one) within a second."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable

import pytest

from console.models import ApiKey
from console.redis_client import CONFIG_CHANNEL, get_redis, key, key_cache_record
from console.services import revoke_api_key
from tests.routing.conftest import Proc, make_tenant_key, post

pytestmark = pytest.mark.django_db(transaction=True)
BODY = {"model": "trivial", "messages": [{"role": "user", "content": "hi"}]}


def _wait_subscribed(count: int) -> None:
    """Proxies read Redis records only with a live config subscription; wait until all have one."""
    deadline = time.monotonic() + 10
    channel = key(CONFIG_CHANNEL)
    while int(dict(get_redis().pubsub_numsub(channel)).get(channel.encode(), 0)) < count:
        assert time.monotonic() < deadline, "proxies never subscribed to config changes"
        time.sleep(0.05)


def _lookups(proxy: Proc, source: str) -> float:
    with urllib.request.urlopen(proxy.url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    line = f'inferchain_proxy_key_lookups_total{{source="{source}"}} '
    return sum(float(row[len(line) :]) for row in text.splitlines() if row.startswith(line))


def test_second_process_resolves_the_key_from_redis(
    start_proxy: Callable[..., Proc], trivial_backend: Proc
) -> None:
    tk = make_tenant_key()
    digest = tk.api_key.hashed_key
    first, second = (start_proxy(static=f"trivial={trivial_backend.url}") for _ in range(2))
    _wait_subscribed(2)

    assert post(first.url + "/v1/chat/completions", tk.raw_key, BODY).status == 200
    assert (_lookups(first, "db"), _lookups(first, "redis")) == (1.0, 0.0)
    record = get_redis().get(key_cache_record(digest))
    assert record is not None and tk.raw_key.encode() not in record  # hashes only

    # Hide the key from the database without telling anyone: only the Redis record can resolve it now.
    ApiKey.objects.filter(pk=tk.api_key.pk).update(hashed_key="0" * 64)
    assert post(second.url + "/v1/chat/completions", tk.raw_key, BODY).status == 200
    assert (_lookups(second, "db"), _lookups(second, "redis")) == (0.0, 1.0)

    ApiKey.objects.filter(pk=tk.api_key.pk).update(hashed_key=digest)
    revoke_api_key(tk.api_key, actor=None)
    revoked_at = time.monotonic()
    assert get_redis().get(key_cache_record(digest)) is None  # the revocation deleted the record
    pending = [first, second]
    while pending and time.monotonic() - revoked_at < 1.0:
        pending = [p for p in pending if post(p.url + "/v1/chat/completions", tk.raw_key, BODY).status != 401]
    assert not pending, f"{len(pending)} proxies still accepted the key after 1 s"

    # A process that never saw the key re-reads it (the revoked copy may then be shared, never an old one).
    third = start_proxy(static=f"trivial={trivial_backend.url}")
    _wait_subscribed(3)
    assert post(third.url + "/v1/chat/completions", tk.raw_key, BODY).status == 401
