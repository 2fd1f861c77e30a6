"""In the browser: a canary whose first step needs an admin's approval. The gate task passes the step and
the rollout waits; the Rollouts page shows each step's decision with its numbers (each gate's outcome,
value against threshold and counts, a dry-run gate marked as such); the admin approves, the canary goes on,
and the next step's decision (the promotion) appears beside the first's."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from console.models import User
from routing.models import Rollout
from routing.rollouts import services
from routing.rollouts.services import evaluate_all
from tests.conftest import PASSWORD
from tests.e2e.harness import LiveConsole, login, screenshot
from tests.routing.rollouts import canary, log_requests, shadow_pair

pytestmark = pytest.mark.e2e


def test_admin_approves_a_manual_step_and_sees_each_steps_decision(
    live_console: LiveConsole, browser_page: Any, admin_user: User, redis_clean: None
) -> None:
    c = canary("llama-approve")
    rollout = services.start_rollout(
        c.alias,
        c.v2,
        [10, 50, 100],
        actor=admin_user,
        gates={"max_error_rate_delta": 0.05, "shadow_min_chrf": 90},
        analysis={"failure_limit": 1, "metrics": {"shadow_min_chrf": {"dry_run": True, "min_samples": 3}}},
        approval_steps=[10],
        min_step_seconds=0,
        min_step_requests=5,
    )
    at = timezone.now()
    log_requests(c.alias, c.v1, 60, at=at)
    log_requests(c.alias, c.v2, 20, at=at)
    for n in range(3):  # the candidate drifts: the dry-run chrF gate fails, and decides nothing
        shadow_pair(c.alias, c.v1, c.v2, "The capital of France is Paris.", f"It is Lyon ({n}).", at=at)
    assert evaluate_all(at + dt.timedelta(seconds=1)) == {rollout.pk: "await_approval"}

    page = browser_page
    login(page, admin_user.username, PASSWORD)
    page.goto(f"/rollouts?id={rollout.pk}")
    detail = page.get_by_test_id("rollout-detail")
    expect(detail).to_contain_text("awaiting_approval")
    expect(page.get_by_test_id("rollout-approval-steps")).to_contain_text("an admin approves after 10%")
    first = page.get_by_test_id("step-decision-0")
    expect(first).to_contain_text("await_approval by gate task")
    expect(first).to_contain_text("waiting for an admin's approval to go on to 50%")
    expect(first).to_contain_text("20 candidate and 60 baseline requests in the step")
    metrics = page.get_by_test_id("step-metrics-0")
    errors = metrics.locator("li[data-metric=max_error_rate_delta]")
    expect(errors).to_have_attribute("data-outcome", "Successful")
    expect(errors).to_contain_text("0 (needs ≤ 0.05); failed 0/1")
    chrf = metrics.locator("li[data-metric=shadow_min_chrf]")
    expect(chrf).to_have_attribute("data-outcome", "Failed")
    expect(chrf).to_contain_text("dry run")
    expect(chrf).to_contain_text("(needs ≥ 90); failed 1/1")
    expect(page.get_by_role("button", name="Pause")).to_have_count(0)
    screenshot(page, "rollouts-awaiting-approval")

    page.get_by_role("button", name="Approve").click()
    page.get_by_role("dialog").get_by_role("button", name="Approve").click()
    expect(page.get_by_test_id("rollout-share")).to_have_text("50%")
    expect(first).to_contain_text(f"approve by {admin_user.username}")
    expect(first).to_contain_text("Approved at 10%: on to 50%.")
    # The first step keeps the numbers its decision was made on.
    expect(errors).to_have_attribute("data-outcome", "Successful")
    rollout.refresh_from_db()
    assert (rollout.state, rollout.step_index) == ("running", 1)

    # The 50 % step's own window: healthy traffic, then one gate-task run promotes.
    later = max(timezone.now(), rollout.step_started_at + dt.timedelta(milliseconds=10))
    log_requests(c.alias, c.v1, 40, at=later)
    log_requests(c.alias, c.v2, 40, at=later)
    assert evaluate_all(later + dt.timedelta(seconds=1)) == {rollout.pk: "promote"}
    expect(detail).to_contain_text("promoted")
    second = page.get_by_test_id("step-decision-1")
    expect(second).to_contain_text("promote by gate task")
    expect(second).to_contain_text("40 candidate and 40 baseline requests in the step")
    expect(
        page.get_by_test_id("step-metrics-1").locator("li[data-metric=max_error_rate_delta]")
    ).to_have_attribute("data-outcome", "Successful")
    # The dry-run gate has no pairs in the second step: Inconclusive, and the promotion went ahead.
    expect(
        page.get_by_test_id("step-metrics-1").locator("li[data-metric=shadow_min_chrf]")
    ).to_have_attribute("data-outcome", "Inconclusive")
    expect(first).to_contain_text("approve")
    assert Rollout.objects.get(pk=rollout.pk).state == "promoted"
    screenshot(page, "rollouts-approved-and-promoted")
