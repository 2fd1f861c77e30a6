"""A tenant's key reaches nothing of another tenant's, through every route that could take a key.

`/v1/` (the proxy process, and the same app mounted in the web process): the routes are listed from the
proxy's own dispatch (`Proxy.__call__`, parsed), so a new route fails the completeness test until it is
covered here. Tenant A's key lists and uses only its own models, its requests are recorded and counted
against A alone, and its limits never spend B's. `/api/`: every operation, read from the resolver, refuses
a tenant key however it is sent (console accounts, not tenant keys, work there).
"""

from __future__ import annotations

import ast
import inspect
import json
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from routing.models import RequestLog
from routing.proxy.app import KINDS, Proxy
from tests.api_routes import api_operations, unlisted_api_patterns
from tests.e2e.harness import start_console
from tests.routing.conftest import Proc, TenantKey, make_tenant_key, post

pytestmark = pytest.mark.django_db(transaction=True)

# Every path the proxy dispatches on, and how each is tested below.
INFERENCE_PATHS = sorted(KINDS)  # POST, with a body naming a model
MODEL_PATHS = ("/v1/models", "/v1/models/{model}")
KEYLESS_PATHS = ("/metrics", "/v1/metrics", "/healthz", "/v1/healthz")  # see test_keyless_routes_...
BODIES: dict[str, dict[str, Any]] = {
    "chat": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    "completion": {"prompt": "hi", "max_tokens": 4},
    "embedding": {"input": "hi"},
}
# Publicly reachable /api/ routes: they answer the same whoever calls (nothing of a tenant's).
PUBLIC_API = {
    "GET /api/auth/csrf/",
    "POST /api/auth/login/",
    "POST /api/auth/logout/",
    "GET /api/schema/",
    "GET /api/docs/",
}


def _dispatched_paths() -> set[str]:
    """String literals that look like paths in the proxy's request dispatch."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(Proxy.__call__)))
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("/")
    }


def test_every_v1_route_is_covered() -> None:
    covered = {*INFERENCE_PATHS, *MODEL_PATHS, "/v1/models/", *KEYLESS_PATHS}
    assert _dispatched_paths() - covered == set()
    assert set(KINDS) <= set(INFERENCE_PATHS)


@dataclass
class Target:
    url: str
    alpha: TenantKey  # tenant A: may use "alpha"
    beta: TenantKey  # tenant B: may use "beta"


@pytest.fixture(params=["proxy", "web"])
def target(
    request: pytest.FixtureRequest,
    start_proxy: Callable[..., Proc],
    trivial_backend: Proc,
    redis_clean: None,
    tmp_path: Path,
) -> Iterator[Target]:
    alpha = make_tenant_key("tenant-a", scopes=["alpha"], requests_per_minute=3)
    beta = make_tenant_key("tenant-b", scopes=["beta"])
    static = f"alpha={trivial_backend.url},beta={trivial_backend.url}"
    if request.param == "proxy":
        yield Target(start_proxy(static=static).url, alpha, beta)
        return
    console = start_console(tmp_path, {"PROXY_STATIC_ENDPOINTS": static})
    try:
        yield Target(console.url, alpha, beta)
    finally:
        console.stop()


def _get(url: str, key: str | None) -> tuple[int, Any]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _rows(expected: int) -> list[RequestLog]:
    deadline = time.monotonic() + 10
    while RequestLog.objects.count() < expected and time.monotonic() < deadline:
        time.sleep(0.1)
    return list(RequestLog.objects.order_by("id"))


def test_a_key_sees_and_uses_only_its_own_tenants_models(target: Target) -> None:
    a, b = target.alpha, target.beta
    assert _get(target.url + "/v1/models", a.raw_key)[1]["data"] == [
        {"id": "alpha", "object": "model", "created": 0, "owned_by": "inferchain"}
    ]
    assert [m["id"] for m in _get(target.url + "/v1/models", b.raw_key)[1]["data"]] == ["beta"]
    status, body = _get(target.url + "/v1/models/beta", a.raw_key)
    assert status == 404 and "not available to this key" in body["error"]["message"]
    assert _get(target.url + "/v1/models/alpha", a.raw_key)[0] == 200
    for path in INFERENCE_PATHS:
        body = {"model": "beta", **BODIES[KINDS[path]]}
        reply = post(target.url + path, a.raw_key, body)
        assert reply.status == 403, (path, reply.text)
        assert reply.json()["error"]["code"] == "model_not_allowed"
        assert "beta" not in reply.json()["error"]["message"].replace("'beta'", "")  # names nothing else


def test_requests_are_recorded_and_limited_as_the_callers_tenant_only(target: Target) -> None:
    a, b = target.alpha, target.beta
    chat = {"model": "alpha", **BODIES["chat"]}
    statuses = [post(target.url + "/v1/chat/completions", a.raw_key, chat).status for _ in range(4)]
    assert statuses == [200, 200, 200, 429]  # A's 3 requests a minute, spent
    # B's budget was not touched by A's traffic: B is served.
    reply = post(target.url + "/v1/chat/completions", b.raw_key, {**chat, "model": "beta"})
    assert reply.status == 200, reply.text
    rows = _rows(5)
    assert len(rows) == 5
    by_tenant = {
        name: [(r.key_prefix, r.alias, r.status) for r in rows if r.tenant_id == tk.tenant.pk]
        for name, tk in (("a", a), ("b", b))
    }
    prefix_a, prefix_b = a.api_key.prefix, b.api_key.prefix
    assert by_tenant["a"] == [(prefix_a, "alpha", 200)] * 3 + [(prefix_a, "alpha", 429)]
    assert by_tenant["b"] == [(prefix_b, "beta", 200)]
    assert {r.tenant_name for r in rows if r.tenant_id == a.tenant.pk} == {"tenant-a"}


def test_keyless_routes_name_no_key(target: Target) -> None:
    """Health and metrics take no key; what they show is not a key's (metrics: see docs/security.md)."""
    post(target.url + "/v1/chat/completions", target.alpha.raw_key, {"model": "alpha", **BODIES["chat"]})
    for path in ("/v1/healthz", "/v1/metrics"):
        with urllib.request.urlopen(target.url + path, timeout=10) as resp:
            text = resp.read().decode()
        for tk in (target.alpha, target.beta):
            assert tk.raw_key not in text and tk.api_key.prefix not in text, path


@pytest.mark.django_db
def test_every_api_route_refuses_a_tenant_key() -> None:
    a = make_tenant_key("tenant-a")
    b = make_tenant_key("tenant-b")
    assert unlisted_api_patterns() == []
    ops = [op for op in api_operations() if str(op) not in PUBLIC_API]
    assert len(ops) >= 140 and {str(op) for op in api_operations()} >= PUBLIC_API
    styles: dict[str, dict[str, Any]] = {
        "bearer": {"HTTP_AUTHORIZATION": f"Bearer {a.raw_key}"},
        "token": {"HTTP_AUTHORIZATION": f"Token {a.raw_key}"},
        "x-api-key": {"HTTP_X_API_KEY": a.raw_key},
        "query": {},
    }
    client = Client()
    checked = 0
    for op in ops:
        # B's objects where a route takes one; the refusal must come before any lookup anyway.
        url = op.url(str(b.api_key.pk if op.path.startswith("/api/keys/") else b.tenant.pk))
        for style, headers in styles.items():
            target_url = url + (f"?api_key={a.raw_key}" if style == "query" else "")
            body = "" if op.method == "GET" else "{}"
            resp = client.generic(op.method, target_url, body, "application/json", **headers)
            assert resp.status_code == 401, (str(op), style, resp.status_code, resp.content[:200])
            assert b"tenant-b" not in resp.content and a.raw_key.encode() not in resp.content
            checked += 1
    # The routers' index page too.
    assert client.get("/api/", HTTP_AUTHORIZATION=f"Bearer {a.raw_key}").status_code == 401
    assert checked == len(ops) * len(styles)


def test_metrics_answer_only_the_metrics_token_once_it_is_set(
    start_proxy: Callable[..., Proc], trivial_backend: Proc, redis_clean: None, tmp_path: Path
) -> None:
    """The expositions count requests per tenant by name: with METRICS_TOKEN set, a tenant's key reads
    nothing there, on the proxy (/metrics, /v1/metrics) and the web process (/v1/metrics, /metrics)."""
    a = make_tenant_key("tenant-a", scopes=["alpha"])
    env = {"METRICS_TOKEN": "scrape-secret-1"}
    static = f"alpha={trivial_backend.url}"
    proxy = start_proxy(static=static, **env)
    console = start_console(tmp_path, {"PROXY_STATIC_ENDPOINTS": static, **env})
    try:
        post(proxy.url + "/v1/chat/completions", a.raw_key, {"model": "alpha", **BODIES["chat"]})
        for url in (proxy.url + "/metrics", proxy.url + "/v1/metrics", console.url + "/v1/metrics"):
            for key in (a.raw_key, None, "scrape-secret-2"):
                status, body = _get(url, key)
                assert status == 401 and body["error"]["code"] == "invalid_metrics_token", (url, key)
            req = urllib.request.Request(url, headers={"Authorization": "Bearer scrape-secret-1"})
            with urllib.request.urlopen(req, timeout=10) as resp:
                assert resp.status == 200 and b"inferchain_proxy" in resp.read()
        fleet = console.url + "/metrics"
        for key in (a.raw_key, None):
            req = urllib.request.Request(fleet, headers={"Authorization": f"Bearer {key}"} if key else {})
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(req, timeout=10)
            assert refused.value.code == 401
        req = urllib.request.Request(fleet, headers={"Authorization": "Bearer scrape-secret-1"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200
    finally:
        console.stop()
