"""Manual approval steps: once a step marked for approval passes its analysis the rollout waits
(`awaiting_approval`) until an admin approves through the API; then it goes on, or from the last step below
100 it is promoted (refused, changing nothing, when the plan's sign-off is missing)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from routing.models import Rollout, RolloutDecision
from routing.rollouts import services
from routing.rollouts.gates import Verdict
from tests.routing.rollouts import Canary, accepted_run, canary, log_requests

pytestmark = pytest.mark.django_db

NOW = timezone.now()


@pytest.fixture
def c(redis_clean: None) -> Canary:
    return canary()


def waiting(c: Canary, steps: list[float], **kw: Any) -> Rollout:
    """A rollout whose first step passed its gates and waits for approval."""
    rollout = services.start_rollout(
        c.alias,
        c.v2,
        steps,
        actor=None,
        gates={"max_error_rate_delta": 0.05},
        approval_steps=[steps[0]],
        min_step_seconds=60,
        min_step_requests=20,
        **kw,
    )
    Rollout.objects.filter(pk=rollout.pk).update(step_started_at=NOW - dt.timedelta(seconds=120))
    rollout.refresh_from_db()
    when = rollout.step_started_at + dt.timedelta(seconds=1)
    log_requests(c.alias, c.v1, 200, at=when)
    log_requests(c.alias, c.v2, 25, at=when)
    verdict, rollout = services.evaluate(rollout, NOW)
    assert verdict == Verdict.AWAIT_APPROVAL
    return rollout


def history(rollout: Rollout) -> list[str]:
    return list(RolloutDecision.objects.filter(rollout=rollout).values_list("action", flat=True))


def test_a_passed_approval_step_waits_until_an_admin_approves(
    c: Canary, admin_client: APIClient, viewer_client: APIClient, evaluator_client: APIClient, admin_user: Any
) -> None:
    rollout = waiting(c, [5, 25, 100])
    assert (rollout.state, rollout.share) == ("awaiting_approval", 5.0)
    assert (
        "All gates passed at 5% (max_error_rate_delta = 0); waiting for an admin's approval to go on to 25%"
        in (rollout.reason)
    )
    # The gate task leaves it alone however long it waits.
    for n in range(3):
        assert services.evaluate(rollout, NOW + dt.timedelta(seconds=10 * n))[0] == Verdict.KEEP
    assert history(rollout) == ["start", "await_approval"]

    for client in (viewer_client, evaluator_client):
        assert client.post(f"/api/rollouts/{rollout.pk}/approve/", {}, format="json").status_code == 403
    approved = admin_client.post(f"/api/rollouts/{rollout.pk}/approve/", {}, format="json")
    assert approved.status_code == 200, approved.json()
    data = approved.json()
    assert (data["state"], data["share"], data["step_index"]) == ("running", 25.0, 1)
    assert data["decisions"][-1]["action"] == "approve"
    assert data["decisions"][-1]["actor_name"] == admin_user.username
    assert data["decisions"][-1]["reason"] == "Approved at 5%: on to 25%."
    # Each step's decision with its numbers: the first step's await (the gates' numbers) then approval.
    first = data["steps_analysis"][0]
    assert (first["status"], first["approval"], first["decision"]["action"]) == ("done", True, "approve")
    assert first["candidate_requests"] == 25 and first["baseline_requests"] == 200
    [gate] = first["metrics"]
    assert (gate["key"], gate["outcome"], gate["value"], gate["threshold"]) == (
        "max_error_rate_delta",
        "Successful",
        0,
        0.05,
    )
    assert gate["counts"]["successful"] == 1
    assert data["steps_analysis"][1]["status"] == "current"

    again = admin_client.post(f"/api/rollouts/{rollout.pk}/approve/", {}, format="json")
    assert again.status_code == 409 and "Cannot approve a rollout that is running" in again.json()["detail"]


def test_approving_the_last_step_below_100_promotes(c: Canary, admin_client: APIClient) -> None:
    rollout = waiting(c, [5, 100])
    approved = admin_client.post(
        f"/api/rollouts/{rollout.pk}/approve/", {"reason": "answers read well"}, format="json"
    )
    assert approved.status_code == 200 and approved.json()["state"] == "promoted"
    assert history(rollout) == ["start", "await_approval", "approve", "promote"]
    c.alias.refresh_from_db()
    assert c.alias.active_version == c.v2


def test_approval_is_refused_by_field_when_the_promotion_is(c: Canary, admin_client: APIClient) -> None:
    rollout = waiting(c, [5, 100], require_signoff=True)
    refused = admin_client.post(f"/api/rollouts/{rollout.pk}/approve/", {}, format="json")
    assert refused.status_code == 400 and "require_signoff" in refused.json()
    rollout.refresh_from_db()
    assert rollout.state == "awaiting_approval" and history(rollout) == ["start", "await_approval"]
    accepted_run(c.v2)
    assert (
        admin_client.post(f"/api/rollouts/{rollout.pk}/approve/", {}, format="json").json()["state"]
        == "promoted"
    )


def test_a_person_may_roll_back_or_promote_a_rollout_awaiting_approval(c: Canary) -> None:
    rollout = waiting(c, [5, 25, 100])
    with pytest.raises(services.RolloutStateError):
        services.resume(rollout, actor=None)
    assert services.rollback(rollout, actor=None, reason="not today").state == "rolled_back"


@pytest.mark.parametrize(
    ("extra", "field", "message"),
    [
        ({"approval_steps": [100]}, "approval_steps", "100% is not a step of the plan below 100"),
        ({"approval_steps": [7]}, "approval_steps", "choose among 5, 50"),
        ({"approval_steps": "5"}, "approval_steps", "list of the plan's percentages"),
        (
            {"analysis": {"failure_limit": -1}},
            "analysis",
            "analysis.failure_limit must be a whole number from 0",
        ),
        ({"analysis": {"failure_limit": 1.5}}, "analysis", "analysis.failure_limit must be a whole number"),
        ({"analysis": {"limit": 1}}, "analysis", "Unknown analysis fields ['limit']"),
        ({"analysis": {"min_samples": 0}}, "analysis", "analysis.min_samples must be a whole number from 1"),
        (
            {"analysis": {"metrics": {"min_chrf": {"dry_run": True}}}},
            "analysis",
            "the plan has no 'min_chrf' gate",
        ),
        (
            {"analysis": {"metrics": {"max_error_rate_delta": {"dry_run": "yes"}}}},
            "analysis",
            "dry_run must be true or false",
        ),
        ({"analysis": {"metrics": {"nope": {}}}}, "analysis", "unknown gate 'nope'"),
    ],
)
def test_bad_analysis_or_approval_steps_are_field_errors(
    c: Canary, admin_client: APIClient, extra: dict[str, Any], field: str, message: str
) -> None:
    body = {
        "alias": c.alias.pk,
        "candidate_version": c.v2.pk,
        "steps": [5, 50, 100],
        "gates": {"max_error_rate_delta": 0.05},
        **extra,
    }
    resp = admin_client.post("/api/rollouts/", body, format="json")
    assert resp.status_code == 400
    assert message in " ".join(resp.json()[field])
    assert not Rollout.objects.exists()


def test_the_plan_is_kept_and_shown(c: Canary, admin_client: APIClient) -> None:
    analysis = {
        "failure_limit": 1,
        "metrics": {"max_error_rate_delta": {"dry_run": True, "inconclusive_limit": None}},
    }
    resp = admin_client.post(
        "/api/rollouts/",
        {
            "alias": c.alias.pk,
            "candidate_version": c.v2.pk,
            "steps": [5, 50, 100],
            "gates": {"max_error_rate_delta": 0.05},
            "analysis": analysis,
            "approval_steps": [50, 5],
        },
        format="json",
    )
    assert resp.status_code == 201, resp.json()
    data = resp.json()
    assert data["analysis"] == analysis and data["approval_steps"] == [5.0, 50.0]
    assert [s["approval"] for s in data["steps_analysis"]] == [True, True, False]
    assert data["decisions"][0]["numbers"]["plan"]["approval_steps"] == [5.0, 50.0]
