"""A key scoped to named aliases, through the real proxy process: it may call and list only those, gets an
OpenAI-shaped error that names them for any other, and a new scope saved in the console applies at the
next request, with no restart (the key change reaches the proxy over the config channel)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from pytest_django.fixtures import Settings
from rest_framework.test import APIClient

from console.models import ApiKey
from tests.console.factories import make_tenant
from tests.routing.conftest import Proc, Reply, post

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _get(url: str, key: str) -> tuple[int, Any]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _listed(url: str, key: str) -> list[str]:
    status, body = _get(url + "/v1/models", key)
    assert status == 200, body
    return [card["id"] for card in body["data"]]


def _until(check: Callable[[], bool], seconds: float = 5.0) -> None:
    """Within seconds, well inside the proxy's 30 s safety-net refresh: the change came over pub/sub."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.05)


@pytest.fixture
def proxy(
    start_proxy: Callable[..., Proc], trivial_backend: Proc, redis_clean: None, settings: Settings
) -> Proc:
    static = f"alpha={trivial_backend.url},beta={trivial_backend.url},gamma={trivial_backend.url}"
    settings.PROXY_STATIC_ENDPOINTS = static  # the console knows the same aliases as the proxy
    return start_proxy(static=static)


def test_a_scoped_key_calls_and_lists_only_its_aliases(proxy: Proc, admin_client: APIClient) -> None:
    tenant = make_tenant("scoped")
    created = admin_client.post(
        "/api/keys/", {"tenant": tenant.pk, "name": "alpha only", "scopes": ["alpha"]}, format="json"
    )
    assert created.status_code == 201, created.content
    raw = created.json()["key"]

    assert _listed(proxy.url, raw) == ["alpha"]
    assert post(proxy.url + "/v1/chat/completions", raw, {"model": "alpha", **CHAT}).status == 200

    refused: Reply = post(proxy.url + "/v1/chat/completions", raw, {"model": "beta", **CHAT})
    assert refused.status == 403
    assert refused.json() == {
        "error": {
            "message": "This API key may not use the model 'beta'. This key may use only: 'alpha'.",
            "type": "permission_error",
            "param": "model",
            "code": "model_not_allowed",
        }
    }
    status, body = _get(proxy.url + "/v1/models/beta", raw)
    assert status == 404 and "may use only: 'alpha'" in body["error"]["message"]
    missing = post(proxy.url + "/v1/completions", raw, {"model": "delta", "prompt": "hi", "max_tokens": 2})
    assert missing.status == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert "may use only: 'alpha'" in missing.json()["error"]["message"]


def test_a_new_scope_applies_without_a_restart(proxy: Proc, admin_client: APIClient) -> None:
    tenant = make_tenant("rescoped")
    created = admin_client.post(
        "/api/keys/", {"tenant": tenant.pk, "name": "k", "scopes": ["alpha"]}, format="json"
    ).json()
    raw, key_id = created["key"], created["id"]
    # The proxy holds the key (and its scope) in its cache from this request on.
    assert post(proxy.url + "/v1/chat/completions", raw, {"model": "beta", **CHAT}).status == 403

    resp = admin_client.patch(f"/api/keys/{key_id}/", {"scopes": ["alpha", "beta"]}, format="json")
    assert resp.status_code == 200, resp.content
    _until(lambda: post(proxy.url + "/v1/chat/completions", raw, {"model": "beta", **CHAT}).status == 200)
    assert _listed(proxy.url, raw) == ["alpha", "beta"]

    # Narrowed again, and then opened to every alias (an empty list).
    admin_client.patch(f"/api/keys/{key_id}/", {"scopes": ["beta"]}, format="json")
    _until(lambda: post(proxy.url + "/v1/chat/completions", raw, {"model": "alpha", **CHAT}).status == 403)
    assert _listed(proxy.url, raw) == ["beta"]
    admin_client.patch(f"/api/keys/{key_id}/", {"scopes": []}, format="json")
    _until(lambda: _listed(proxy.url, raw) == ["alpha", "beta", "gamma"])
    assert ApiKey.objects.get(pk=key_id).scopes == []
