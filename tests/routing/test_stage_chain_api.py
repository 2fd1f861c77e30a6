"""Stage chains through the admin API: refused with the reason when they cannot work, versioned, audited."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from rest_framework.test import APIClient

from console.models import Tenant
from core.models import AuditEvent
from models_registry.models import ModelAlias
from nodes.models import Deployment, Host
from routing.models import RoutePool, StageChain, StageChainVersion
from tests.routing.fleet import ensure_alias

pytestmark = pytest.mark.django_db(transaction=True)

GENERATE = {"kind": "generate"}


def ready_deployment(alias: str, role: str = "") -> None:
    ensure_alias(alias)
    host, _ = Host.objects.get_or_create(name="chain-host", defaults={"address": "127.0.0.1"})
    Deployment.objects.create(
        name=f"{alias}-{secrets.token_hex(3)}",
        model_version=ModelAlias.objects.get(name=alias).active_version,
        host=host,
        port=9,
        served_model_name=alias,
        role=role,
        state="ready",
        engine="sim",
    )


def save(client: APIClient, stages: list[dict], name: str = "c", **extra: object) -> tuple[int, dict]:
    resp = client.post("/api/stage-chains/", {"name": name, "stages": stages, **extra}, format="json")
    return resp.status_code, resp.json()


@pytest.mark.parametrize(
    ("stages", "reason"),
    [
        ([{"kind": "guard", "config": {"terms": ["a"]}}], "no generate step"),
        ([GENERATE, {"kind": "generate", "name": "again"}], "2 generate steps"),
        (
            [GENERATE, {"kind": "guard", "config": {"terms": ["(unclosed"], "regex": True}}],
            "regular expression",
        ),
        ([GENERATE, {"kind": "guard", "config": {"terms": []}}], "non-empty list"),
        ([GENERATE, {"kind": "guard", "config": {"terms": ["x"], "action": "shout"}}], "block, mask"),
        ([{"kind": "teleport"}, GENERATE], "kind must be one of"),
        ([{"kind": "generate", "config": {"pool": "nowhere"}}], "no pool named 'nowhere'"),
        ([{"kind": "chain", "config": {"chain": "missing"}}], "no chain named 'missing'"),
    ],
)
def test_a_chain_that_cannot_work_is_refused_with_the_reason(
    admin_client: APIClient, stages: list[dict], reason: str
) -> None:
    status, body = save(admin_client, stages, alias="llama")
    assert status == 400
    assert reason in body["stages"][0]
    assert not StageChain.objects.exists()


def test_a_stage_pointing_at_an_empty_pool_is_refused(admin_client: APIClient) -> None:
    ready_deployment("llama")
    RoutePool.objects.create(name="big", alias="llama", role="long")  # no deployment has that role
    status, body = save(admin_client, [{"kind": "generate", "config": {"pool": "big"}}], alias="llama")
    assert status == 400 and "the pool 'big' is empty" in body["stages"][0]
    ready_deployment("llama", role="long")
    status, body = save(admin_client, [{"kind": "generate", "config": {"pool": "big"}}], alias="llama")
    assert status == 201, body


def test_a_cycle_of_included_chains_is_refused(admin_client: APIClient) -> None:
    guard = {"kind": "guard", "name": "g", "config": {"terms": ["x"]}}
    assert save(admin_client, [guard], name="base")[0] == 201  # a library chain: applies to nothing itself
    assert (
        save(admin_client, [{"kind": "chain", "config": {"chain": "base"}}, GENERATE], name="top", alias="m")[
            0
        ]
        == 201
    )
    base = StageChain.objects.get(name="base")
    resp = admin_client.patch(
        f"/api/stage-chains/{base.pk}/",
        {"stages": [guard, {"kind": "chain", "name": "back", "config": {"chain": "top"}}]},
        format="json",
    )
    assert resp.status_code == 400 and "cycle: base -> top -> base" in resp.json()["stages"][0]
    # Giving the library chain a generate step would leave its includer with two.
    resp = admin_client.patch(f"/api/stage-chains/{base.pk}/", {"stages": [guard, GENERATE]}, format="json")
    assert resp.status_code == 400 and "chain 'top' includes this one" in resp.json()["stages"][0]
    assert StageChain.objects.get(name="base").version == 1


def test_each_save_is_a_version_and_an_audit_event(admin_client: APIClient) -> None:
    Tenant.objects.create(name="acme")
    stages: list[dict[str, Any]] = [
        GENERATE,
        {"kind": "guard", "name": "terms", "config": {"terms": ["secret"], "action": "mask"}},
    ]
    status, body = save(admin_client, stages, alias="llama", tenant="acme")
    assert status == 201 and body["version"] == 1 and body["tenant"] == "acme"
    stages[1]["config"]["action"] = "block"
    resp = admin_client.patch(f"/api/stage-chains/{body['id']}/", {"stages": stages}, format="json")
    assert resp.status_code == 200 and resp.json()["version"] == 2
    versions = admin_client.get(f"/api/stage-chains/{body['id']}/versions/").json()
    assert [v["version"] for v in versions] == [2, 1]
    assert versions[1]["stages"][1]["config"]["action"] == "mask"
    assert versions[0]["created_by"] == "alice-admin"
    assert StageChainVersion.objects.count() == 2
    assert AuditEvent.objects.filter(object_type="routing.stagechain").count() == 2
    # One chain per alias and tenant.
    status, body = save(admin_client, [GENERATE], name="other", alias="llama", tenant="acme")
    assert status == 400 and "already applies" in body["alias"][0]


def test_viewers_cannot_write_chains(viewer_client: APIClient) -> None:
    resp = viewer_client.post("/api/stage-chains/", {"name": "c", "stages": [GENERATE]}, format="json")
    assert resp.status_code == 403


def test_a_classify_rule_needs_a_pool_with_ready_deployments_and_comes_first(admin_client: APIClient) -> None:
    ready_deployment("llama")
    rules = {"rules": [{"match": {"keywords": ["refund"]}, "pool": "support"}]}
    status, body = save(admin_client, [{"kind": "classify", "config": rules}, GENERATE], alias="llama")
    assert status == 400 and "no pool named 'support'" in body["stages"][0]
    bad = {"rules": [{"match": {"keywords": ["[a-"], "regex": True}, "pool": "llama"}]}
    status, body = save(admin_client, [{"kind": "classify", "config": bad}, GENERATE], alias="llama")
    assert status == 400 and "not a valid regular expression" in body["stages"][0]
    good = {"rules": [{"match": {"code": True}, "pool": "llama"}]}
    status, body = save(admin_client, [GENERATE, {"kind": "classify", "config": good}], alias="llama")
    assert status == 400 and "comes after the generate step" in body["stages"][0]
    status, body = save(admin_client, [{"kind": "classify", "config": good}, GENERATE], alias="llama")
    assert status == 201, body


def test_versions_are_the_whole_history_as_a_list_with_the_tenant_by_name(admin_client: APIClient) -> None:
    # The console's history view reads this list (not a page) and shows the tenant by name.
    Tenant.objects.create(name="acme")
    status, body = save(admin_client, [GENERATE], alias="llama", tenant="acme")
    assert status == 201, body
    for _ in range(3):
        resp = admin_client.patch(
            f"/api/stage-chains/{body['id']}/", {"enabled": not body["enabled"]}, format="json"
        )
        body = resp.json()
    versions = admin_client.get(f"/api/stage-chains/{body['id']}/versions/", {"limit": 1}).json()
    assert isinstance(versions, list) and [v["version"] for v in versions] == [4, 3, 2, 1]
    assert {v["tenant"] for v in versions} == {"acme"}
    assert [v["enabled"] for v in versions] == [False, True, False, True]
    assert versions[0]["stages"] == [GENERATE]


def test_deleting_a_chain_is_audited(admin_client: APIClient) -> None:
    status, body = save(admin_client, [GENERATE], alias="llama")
    assert status == 201, body
    assert admin_client.delete(f"/api/stage-chains/{body['id']}/").status_code == 204
    assert not StageChain.objects.exists()
    events = AuditEvent.objects.filter(object_type="routing.stagechain")
    actions = set(events.values_list("action", flat=True))
    assert len(actions) == 2, actions  # created, then deleted
