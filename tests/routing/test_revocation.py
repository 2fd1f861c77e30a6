"""A revoked key is refused by every proxy process within one second (pub/sub, not TTL)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from console.services import revoke_api_key
from tests.routing.conftest import Proc, make_tenant_key, post

pytestmark = pytest.mark.django_db(transaction=True)


def _status(proxy: Proc, key: str) -> int:
    body = {"model": "trivial", "messages": [{"role": "user", "content": "hi"}]}
    return post(proxy.url + "/v1/chat/completions", key, body, timeout=5).status


def test_revoked_key_refused_everywhere_within_a_second(
    start_proxy: Callable[..., Proc], trivial_backend: Proc
) -> None:
    tk = make_tenant_key()
    proxies = [start_proxy(static=f"trivial={trivial_backend.url}") for _ in range(2)]
    assert [_status(p, tk.raw_key) for p in proxies] == [200, 200]  # now cached in both
    revoke_api_key(tk.api_key, actor=None)
    revoked_at = time.monotonic()
    pending = set(range(len(proxies)))
    while pending and time.monotonic() - revoked_at < 1.0:
        pending = {i for i in pending if _status(proxies[i], tk.raw_key) != 401}
    assert not pending, f"proxies {pending} still accepted the key after 1 s"


def test_failed_auth_never_echoes_the_key(start_proxy: Callable[..., Proc], trivial_backend: Proc) -> None:
    proxy = start_proxy(static=f"trivial={trivial_backend.url}")
    bogus = "ick_this-is-not-a-real-key-0123456789"
    resp = post(
        proxy.url + "/v1/chat/completions",
        bogus,
        {"model": "trivial", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert resp.status == 401
    assert resp.json()["error"]["type"] == "authentication_error"
    assert bogus not in resp.text and bogus[:12] not in resp.text
    assert bogus not in proxy.log()
