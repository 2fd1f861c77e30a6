"""With Redis unreachable the proxy fails closed for limited keys (503), serves unlimited ones, and
still refuses a revoked key within a second (it re-reads cached keys from the database each second)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from console.services import revoke_api_key
from tests.routing.conftest import Proc, free_port, make_tenant_key, post

pytestmark = pytest.mark.django_db(transaction=True)
BODY = {"model": "trivial", "messages": [{"role": "user", "content": "hi"}]}


def test_redis_down_is_a_deliberate_mode(start_proxy: Callable[..., Proc], trivial_backend: Proc) -> None:
    limited = make_tenant_key("limited", requests_per_minute=100)
    unlimited = make_tenant_key("unlimited")
    dead_redis = f"redis://127.0.0.1:{free_port()}/0"
    proxy = start_proxy(static=f"trivial={trivial_backend.url}", REDIS_URL=dead_redis)
    url = proxy.url + "/v1/chat/completions"

    refused = post(url, limited.raw_key, BODY)
    assert refused.status == 503
    assert refused.json()["error"]["code"] == "limits_unavailable"

    assert post(url, unlimited.raw_key, BODY).status == 200
    revoke_api_key(unlimited.api_key, actor=None)  # the publish goes nowhere: Redis is down
    revoked_at = time.monotonic()
    while post(url, unlimited.raw_key, BODY).status == 200:
        assert time.monotonic() - revoked_at < 1.5, "revoked key still accepted"
        time.sleep(0.05)
    assert post(url, unlimited.raw_key, BODY).status == 401
