"""A key one proxy process read from the database is resolved by another from Redis, with no query,
and a revocation still reaches both (and a freshly started one) within a second."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable

import pytest

from console.models import ApiKey
from console.services import revoke_api_key
from core.redis_client import get_redis, key_cache_record
from tests.routing.conftest import Proc, make_tenant_key, post

pytestmark = pytest.mark.django_db(transaction=True)
BODY = {"model": "trivial", "messages": [{"role": "user", "content": "hi"}]}


def _wait_subscribed(*proxies: Proc) -> None:
    """Proxies read Redis records only with a live config subscription; wait until all have one."""
    deadline = time.monotonic() + 10
    for proxy in proxies:
        while True:
            with urllib.request.urlopen(proxy.url + "/healthz", timeout=5) as resp:
                if json.loads(resp.read())["config_subscribed"]:
                    break
            assert time.monotonic() < deadline, "proxy never subscribed to config changes"
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
    _wait_subscribed(first, second)

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
    _wait_subscribed(third)
    assert post(third.url + "/v1/chat/completions", tk.raw_key, BODY).status == 401
