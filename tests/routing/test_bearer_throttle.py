"""Malformed bearer strings are refused from their shape, before any lookup; failed attempts are
throttled per source address across proxy processes (Redis) with a 429 and Retry-After."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable

import pytest

from routing.proxy.bearer import malformed
from tests.routing.conftest import Proc, make_tenant_key, post

pytestmark = pytest.mark.django_db(transaction=True)
BODY = {"model": "trivial", "messages": [{"role": "user", "content": "hi"}]}
WELL_FORMED_UNKNOWN = "ick_" + "A" * 43


def lookups(proxy: Proc) -> float:
    """Key lookups that reached Redis or the database (inferchain_proxy_key_lookups_total)."""
    with urllib.request.urlopen(proxy.url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(
        float(m) for m in re.findall(r"^inferchain_proxy_key_lookups_total\{[^}]*\} (\S+)$", text, re.M)
    )


def test_shape_check_names_what_is_wrong() -> None:
    assert malformed(WELL_FORMED_UNKNOWN) is None
    assert "start with 'ick_'" in (malformed("sk-" + "a" * 44) or "")
    assert "47 characters long, this one has 10" in (malformed("ick_abcdef") or "")
    assert "only letters, digits" in (malformed("ick_" + "'" + "a" * 42) or "")


def test_malformed_bearer_is_refused_before_any_lookup(
    start_proxy: Callable[..., Proc], trivial_backend: Proc, redis_clean: None
) -> None:
    proxy = start_proxy(static=f"trivial={trivial_backend.url}", PROXY_AUTH_FAILURES_PER_WINDOW="1000")
    url = proxy.url + "/v1/chat/completions"
    before = lookups(proxy)
    for bad in ("' OR 1=1 --", "sk-" + "x" * 48, "ick_short", "ick_" + '"' * 43, "ick_" + "é" * 43):
        reply = post(url, None, BODY, headers={"Authorization": f"Bearer {bad}".encode().decode("latin-1")})
        assert reply.status == 401, (bad, reply.text)
        error = reply.json()["error"]
        assert error["code"] == "invalid_api_key" and error["type"] == "authentication_error"
        assert error["message"].startswith("Malformed API key:") and bad not in error["message"]
    assert lookups(proxy) == before, "a malformed key reached a key lookup"
    assert post(url, WELL_FORMED_UNKNOWN, BODY).status == 401
    assert lookups(proxy) > before  # a well-formed one is looked up


def test_failed_attempts_are_throttled_per_address_across_processes(
    start_proxy: Callable[..., Proc], trivial_backend: Proc, redis_clean: None
) -> None:
    env = {"PROXY_AUTH_FAILURES_PER_WINDOW": "5", "PROXY_AUTH_FAILURE_WINDOW_SECONDS": "3"}
    first = start_proxy(static=f"trivial={trivial_backend.url}", **env)
    second = start_proxy(static=f"trivial={trivial_backend.url}", **env)
    good = make_tenant_key("throttled")
    assert post(first.url + "/v1/chat/completions", good.raw_key, BODY).status == 200  # cached in `first`

    statuses = []
    for n in range(6):  # alternate processes: the count is shared
        proxy = first if n % 2 == 0 else second
        guess = WELL_FORMED_UNKNOWN if n % 3 else "not-a-key"
        statuses.append(post(proxy.url + "/v1/chat/completions", guess, BODY).status)
    assert statuses == [401] * 5 + [429], statuses
    blocked_at = time.monotonic()

    refused = post(second.url + "/v1/chat/completions", "ick_" + "B" * 43, BODY)
    assert refused.status == 429
    error = refused.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "too_many_invalid_keys"
    assert "Retry after" in error["message"]
    assert 1 <= int(refused.headers["retry-after"]) <= 3
    # A key this process already knows is not slowed down or blocked by its address's guessing.
    assert post(first.url + "/v1/chat/completions", good.raw_key, BODY).status == 200

    while time.monotonic() - blocked_at < 3.5:
        time.sleep(0.2)
    assert post(second.url + "/v1/chat/completions", WELL_FORMED_UNKNOWN, BODY).status == 401
