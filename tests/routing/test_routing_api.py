"""Admin API for pools and policies: validation, roles, audit, and a change notice to the proxies."""

from __future__ import annotations

import json

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from core.models import AuditEvent
from core.redis_client import get_redis
from routing.models import RoutePolicy, RoutePool

pytestmark = pytest.mark.django_db(transaction=True)


def test_admin_creates_pool_and_proxies_are_told(admin_client: APIClient, redis_clean: None) -> None:
    pubsub = get_redis().pubsub()
    pubsub.subscribe(settings.REDIS_KEY_PREFIX + "config")
    pubsub.get_message(timeout=1)
    resp = admin_client.post(
        "/api/route-pools/",
        {"name": "fast", "alias": "llama", "scorer": "weighted", "scorer_weights": {"load": 1, "kv": 2}},
        format="json",
    )
    assert resp.status_code == 201, resp.content
    assert RoutePool.objects.get(name="fast").scorer_weights == {"load": 1.0, "kv": 2.0}
    assert AuditEvent.objects.filter(object_type="routing.routepool").exists()
    msg = pubsub.get_message(timeout=2)
    assert msg is not None and json.loads(msg["data"])["kind"] == "route_pool"
    pubsub.close()


@pytest.mark.parametrize(
    "body",
    [
        {"name": "x", "alias": "a", "scorer": "fastest"},
        {"name": "x", "alias": "a", "scorer_weights": {"speed": 1}},
        {"name": "x", "alias": "a", "connect_timeout_s": 0},
        {"name": "x", "alias": "a", "unknown_field": 1},
        {"name": "x", "alias": "a", "batch_max_fraction": 1.5},
        {"name": "x", "alias": "a", "batch_max_fraction": -0.1},
    ],
)
def test_bad_pool_is_refused_with_field_errors(admin_client: APIClient, body: dict[str, object]) -> None:
    resp = admin_client.post("/api/route-pools/", body, format="json")
    assert resp.status_code == 400
    assert set(resp.json()) & (set(body) - {"name", "alias"}), resp.content  # the bad field is named
    assert not RoutePool.objects.exists()


def test_policy_rules_are_validated(admin_client: APIClient) -> None:
    RoutePool.objects.create(name="fast", alias="llama")
    bad = admin_client.post(
        "/api/route-policies/",
        {"name": "p", "alias": "llama", "rules": [{"match": {"max_prompt_tokens": -1}, "pool": "fast"}]},
        format="json",
    )
    assert bad.status_code == 400 and "rules" in bad.json()
    missing = admin_client.post(
        "/api/route-policies/",
        {"name": "p", "alias": "llama", "rules": [{"match": {}, "pool": "nope"}]},
        format="json",
    )
    assert missing.status_code == 400
    ok = admin_client.post(
        "/api/route-policies/",
        {
            "name": "p",
            "alias": "llama",
            "rules": [{"match": {"task": "summarize", "priority": "batch"}, "pool": "fast"}],
            "fallback_pool": "fast",
        },
        format="json",
    )
    assert ok.status_code == 201, ok.content
    assert RoutePolicy.objects.get().fallback_pool is not None


def test_viewer_reads_but_cannot_write(viewer_client: APIClient) -> None:
    assert viewer_client.get("/api/route-pools/").status_code == 200
    assert (
        viewer_client.post("/api/route-pools/", {"name": "x", "alias": "a"}, format="json").status_code == 403
    )


def test_policy_rule_spill_is_validated(admin_client: APIClient) -> None:
    RoutePool.objects.create(name="fast", alias="llama")
    RoutePool.objects.create(name="long", alias="llama")
    for spill, says in (
        ({"pool": "nope"}, "no pool named 'nope' to spill onto"),
        ({"pool": "fast"}, "own pool"),
        ({"pool": "long", "max_kv_used": 2}, "max_kv_used"),
        ({"pool": "long", "burst": 1}, "unknown spill keys"),
    ):
        bad = admin_client.post(
            "/api/route-policies/",
            {"name": "p", "alias": "llama", "rules": [{"pool": "fast", "spill": spill}]},
            format="json",
        )
        assert bad.status_code == 400 and says in json.dumps(bad.json()["rules"]), bad.content
    assert not RoutePolicy.objects.exists()
    rules = [
        {"match": {"max_prompt_tokens": 6000}, "pool": "fast", "spill": {"pool": "long", "max_inflight": 4}}
    ]
    ok = admin_client.post(
        "/api/route-policies/", {"name": "p", "alias": "llama", "rules": rules}, format="json"
    )
    assert ok.status_code == 201, ok.content
    assert RoutePolicy.objects.get().rules == rules
