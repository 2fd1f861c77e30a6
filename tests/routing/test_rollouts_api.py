"""The rollouts and shadow-config API: every route for every role, and bad input refused by field."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from rest_framework.test import APIClient

from core.models import AuditEvent
from routing.models import Rollout, ShadowConfig
from routing.rollouts import services
from tests.routing.rollouts import Canary, canary, log_requests, new_version

pytestmark = pytest.mark.django_db

PLAN = {
    "steps": [5, 50, 100],
    "gates": {"max_error_rate_delta": 0.05, "max_p95_latency_ratio": 2},
    "min_step_seconds": 1,
    "min_step_requests": 10,
}


@pytest.fixture
def c(redis_clean: None) -> Canary:
    return canary()


def body(c: Canary, **kw: Any) -> dict[str, Any]:
    return {"alias": c.alias.pk, "candidate_version": c.v2.pk, **PLAN, **kw}


def started(c: Canary) -> Rollout:
    return services.start_rollout(
        c.alias,
        c.v2,
        PLAN["steps"],
        actor=None,
        gates=PLAN["gates"],
        min_step_seconds=1,
        min_step_requests=10,
    )


# -- reads: every signed-in role -----------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["admin_client", "evaluator_client", "viewer_client"])
def test_every_role_reads(c: Canary, who: str, request: pytest.FixtureRequest) -> None:
    client: APIClient = request.getfixturevalue(who)
    rollout = started(c)
    ShadowConfig.objects.create(alias=c.alias, candidate_version=c.v2, percent=10)
    listed = client.get("/api/rollouts/", {"active": "true"})
    assert listed.status_code == 200 and [r["id"] for r in listed.json()["results"]] == [rollout.pk]
    assert client.get("/api/rollouts/", {"active": "false"}).json()["results"] == []
    detail = client.get(f"/api/rollouts/{rollout.pk}/")
    assert detail.status_code == 200
    data = detail.json()
    assert [d["action"] for d in data["decisions"]] == ["start"]
    assert data["decisions"][0]["actor_name"] == "gate task"  # started by no user here
    assert data["split"] == [
        {
            "version_id": c.v1.pk,
            "version_label": str(c.v1),
            "role": "active",
            "share": 95.0,
            "ready_deployments": 1,
        },
        {
            "version_id": c.v2.pk,
            "version_label": str(c.v2),
            "role": "candidate",
            "share": 5.0,
            "ready_deployments": 1,
        },
    ]
    gates = client.get(f"/api/rollouts/{rollout.pk}/gates/")
    assert gates.status_code == 200
    assert [g["key"] for g in gates.json()["gates"]] == ["max_error_rate_delta", "max_p95_latency_ratio"]
    assert client.get("/api/shadow-configs/").json()["count"] == 1
    serving = client.get("/api/routing/serving/")
    assert serving.status_code == 200
    [row] = [r for r in serving.json() if r["alias_name"] == c.alias.name]
    # The candidate is both the canary and the shadow's target: one row, with both shares.
    assert [(v["role"], v["configured_share"], v["mirrored_percent"]) for v in row["versions"]] == [
        ("active", 95, None),
        ("candidate", 5, 10),
    ]


def test_anonymous_reads_nothing(c: Canary, anon_client: APIClient) -> None:
    rollout = started(c)
    for path in (
        "/api/rollouts/",
        f"/api/rollouts/{rollout.pk}/",
        "/api/shadow-configs/",
        "/api/routing/serving/",
    ):
        assert anon_client.get(path).status_code == 401
    assert anon_client.post(f"/api/rollouts/{rollout.pk}/rollback/").status_code == 401


# -- writes: admins only -------------------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["evaluator_client", "viewer_client"])
def test_evaluators_and_viewers_cannot_write(c: Canary, who: str, request: pytest.FixtureRequest) -> None:
    client: APIClient = request.getfixturevalue(who)
    assert client.post("/api/rollouts/", body(c), format="json").status_code == 403
    rollout = started(c)
    for act in ("pause", "resume", "promote", "rollback"):
        assert client.post(f"/api/rollouts/{rollout.pk}/{act}/", {}, format="json").status_code == 403
    shadow = {"alias": c.alias.pk, "candidate_version": c.v2.pk, "percent": 10}
    assert client.post("/api/shadow-configs/", shadow, format="json").status_code == 403
    config = ShadowConfig.objects.create(alias=c.alias, candidate_version=c.v2, percent=10)
    assert client.patch(f"/api/shadow-configs/{config.pk}/", {"percent": 5}, format="json").status_code == 403
    assert client.delete(f"/api/shadow-configs/{config.pk}/").status_code == 403
    rollout.refresh_from_db()
    assert rollout.state == "running"


def test_admin_starts_and_drives_a_rollout(c: Canary, admin_client: APIClient, admin_user: Any) -> None:
    created = admin_client.post("/api/rollouts/", body(c), format="json")
    assert created.status_code == 201, created.json()
    data = created.json()
    assert (data["state"], data["share"], data["created_by_name"]) == ("running", 5.0, admin_user.username)
    assert data["decisions"][0]["actor_name"] == admin_user.username
    rid = data["id"]

    paused = admin_client.post(f"/api/rollouts/{rid}/pause/", {"reason": "looking at answers"}, format="json")
    assert paused.status_code == 200 and paused.json()["state"] == "paused"
    assert paused.json()["reason"] == "looking at answers"
    again = admin_client.post(f"/api/rollouts/{rid}/pause/", {}, format="json")
    assert again.status_code == 409 and "Cannot pause a rollout that is paused" in again.json()["detail"]
    resumed = admin_client.post(f"/api/rollouts/{rid}/resume/", {}, format="json")
    assert resumed.status_code == 200 and resumed.json()["state"] == "running"

    promoted = admin_client.post(f"/api/rollouts/{rid}/promote/", {}, format="json")
    assert promoted.status_code == 200 and promoted.json()["state"] == "promoted"
    c.alias.refresh_from_db()
    assert c.alias.active_version == c.v2
    assert [d["action"] for d in promoted.json()["decisions"]] == ["start", "pause", "resume", "promote"]
    assert promoted.json()["split"][1]["share"] == 100
    actions = AuditEvent.objects.filter(actor_name=admin_user.username).values_list("object_type", "action")
    assert ("models_registry.modelalias", "switch") in actions
    assert admin_client.post(f"/api/rollouts/{rid}/rollback/", {}, format="json").status_code == 409


def test_admin_rolls_back(c: Canary, admin_client: APIClient) -> None:
    rollout = started(c)
    reply = admin_client.post(f"/api/rollouts/{rollout.pk}/rollback/", {"reason": "manual"}, format="json")
    assert reply.status_code == 200
    assert (reply.json()["state"], reply.json()["share"], reply.json()["reason"]) == (
        "rolled_back",
        0,
        "manual",
    )
    assert [v["share"] for v in reply.json()["split"]] == [100, 0]


def test_promote_without_the_required_signoff_is_refused(c: Canary, admin_client: APIClient) -> None:
    rid = admin_client.post("/api/rollouts/", body(c, require_signoff=True), format="json").json()["id"]
    reply = admin_client.post(f"/api/rollouts/{rid}/promote/", {}, format="json")
    assert reply.status_code == 400
    assert "requires a signed-off offline evaluation" in reply.json()["require_signoff"][0]
    c.alias.refresh_from_db()
    assert c.alias.active_version == c.v1


def test_gate_values_over_time(c: Canary, admin_client: APIClient) -> None:
    rollout = started(c)
    at = rollout.step_started_at + dt.timedelta(milliseconds=10)
    log_requests(c.alias, c.v1, 50, latency_ms=100, at=at)
    log_requests(c.alias, c.v2, 12, latency_ms=150, at=at)
    services.evaluate(rollout, rollout.step_started_at + dt.timedelta(seconds=5))
    series = admin_client.get(f"/api/rollouts/{rollout.pk}/gates/").json()
    assert {g["key"]: g["threshold"] for g in series["gates"]} == {
        "max_error_rate_delta": 0.05,
        "max_p95_latency_ratio": 2,
    }
    tick = [p for p in series["points"] if p["kind"] == "tick"]
    assert len(tick) == 1 and tick[0]["values"]["max_p95_latency_ratio"] == 1.5
    decisions = [p["verdict"] for p in series["points"] if p["kind"] == "decision"]
    assert decisions == ["start", "advance"]


# -- bad input -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"steps": [10, 5, 100]}, "steps", "Steps must rise"),
        ({"steps": [5, 50]}, "steps", "The last step must be 100"),
        ({"steps": "5,100"}, "steps", "list of percentages"),
        ({"gates": {"max_foo": 1}}, "gates", "Unknown gates"),
        ({"min_step_requests": 0}, "min_step_requests", "greater than or equal to 1"),
        ({"share": 50}, "share", "Unknown or read-only field"),
    ],
)
def test_bad_plans_are_refused_with_the_field(
    c: Canary, admin_client: APIClient, change: dict[str, Any], field: str, message: str
) -> None:
    reply = admin_client.post("/api/rollouts/", body(c, **change), format="json")
    assert reply.status_code == 400
    assert message in reply.json()[field][0]
    assert not Rollout.objects.exists()


def test_candidate_without_a_ready_deployment_and_second_rollout_are_refused(
    c: Canary, admin_client: APIClient
) -> None:
    v3 = new_version(c.alias, "v3")
    reply = admin_client.post("/api/rollouts/", body(c, candidate_version=v3.pk), format="json")
    assert reply.status_code == 400
    assert "has no ready deployment serving 'llama-canary'" in reply.json()["candidate_version"][0]
    assert admin_client.post("/api/rollouts/", body(c), format="json").status_code == 201
    second = admin_client.post("/api/rollouts/", body(c), format="json")
    assert second.status_code == 400
    assert "already has an active rollout" in second.json()["alias"][0]
    assert Rollout.objects.count() == 1


# -- shadow configs ------------------------------------------------------------------------------------------


def test_admin_edits_shadow_configs_audited(c: Canary, admin_client: APIClient) -> None:
    created = admin_client.post(
        "/api/shadow-configs/",
        {"alias": c.alias.pk, "candidate_version": c.v2.pk, "percent": 10},
        format="json",
    )
    assert created.status_code == 201, created.json()
    sid = created.json()["id"]
    assert created.json()["candidate_label"] == str(c.v2)
    patched = admin_client.patch(f"/api/shadow-configs/{sid}/", {"percent": 25.5}, format="json")
    assert patched.status_code == 200 and patched.json()["percent"] == 25.5
    assert admin_client.delete(f"/api/shadow-configs/{sid}/").status_code == 204
    actions = list(
        AuditEvent.objects.filter(object_type="routing.shadowconfig")
        .order_by("id")
        .values_list("action", flat=True)
    )
    assert actions == ["create", "update", "delete"]


@pytest.mark.parametrize("percent", [-1, 100.5, 150])
def test_shadow_percent_outside_0_100_is_refused(c: Canary, admin_client: APIClient, percent: float) -> None:
    reply = admin_client.post(
        "/api/shadow-configs/",
        {"alias": c.alias.pk, "candidate_version": c.v2.pk, "percent": percent},
        format="json",
    )
    assert reply.status_code == 400
    assert reply.json() == {"percent": ["Must be a percentage from 0 to 100."]}
    assert not ShadowConfig.objects.exists()


def test_shadow_candidate_must_have_a_ready_deployment(c: Canary, admin_client: APIClient) -> None:
    v3 = new_version(c.alias, "v3")
    reply = admin_client.post(
        "/api/shadow-configs/", {"alias": c.alias.pk, "candidate_version": v3.pk, "percent": 5}, format="json"
    )
    assert reply.status_code == 400
    assert "no ready deployment serving 'llama-canary'" in reply.json()["candidate_version"][0]
    same = admin_client.post(
        "/api/shadow-configs/",
        {"alias": c.alias.pk, "candidate_version": c.v1.pk, "percent": 5},
        format="json",
    )
    assert same.status_code == 400 and "already the active version" in same.json()["candidate_version"][0]
    config = ShadowConfig.objects.create(alias=c.alias, candidate_version=c.v2, percent=10)
    moved = admin_client.patch(
        f"/api/shadow-configs/{config.pk}/", {"candidate_version": v3.pk}, format="json"
    )
    assert moved.status_code == 400 and "candidate_version" in moved.json()
    duplicate = admin_client.post(
        "/api/shadow-configs/",
        {"alias": c.alias.pk, "candidate_version": c.v2.pk, "percent": 5},
        format="json",
    )
    assert duplicate.status_code == 400 and "alias" in duplicate.json()
