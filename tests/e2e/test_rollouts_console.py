"""In the browser: an admin starts a canary on the Rollouts page (a bad plan is refused next to its field),
watches the gate task advance it (request-log rows as the proxy writes them, then the beat task's body),
sees the split on the aliases page, and rolls it back; the history shows each decision. A viewer sees the
page without any write action."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from console.models import User
from routing.models import Rollout
from routing.rollouts.services import evaluate_all
from tests.conftest import PASSWORD
from tests.e2e.harness import LiveConsole, login, screenshot
from tests.routing.rollouts import canary, log_requests

pytestmark = pytest.mark.e2e


def test_start_watch_advance_and_roll_back_a_canary(
    live_console: LiveConsole, browser_page: Any, admin_user: User, redis_clean: None
) -> None:
    c = canary("llama-e2e")
    page = browser_page
    login(page, admin_user.username, PASSWORD)
    page.get_by_role("link", name="Rollouts").click()
    expect(page.get_by_test_id("split-table")).to_contain_text("llama-e2e")
    expect(page.get_by_test_id("rollouts-table")).to_contain_text("No rollouts yet.")

    page.get_by_role("button", name="Start rollout").click()
    dialog = page.get_by_test_id("start-rollout-dialog")
    dialog.get_by_label("Alias").select_option(label=f"llama-e2e (now {c.v1})")
    dialog.get_by_label("Candidate version").select_option(label=str(c.v2))
    dialog.get_by_label("Steps (%)").fill("10, 5, 100")
    dialog.get_by_label("Min seconds per step").fill("0")
    dialog.get_by_label("Min candidate requests per step").fill("5")
    dialog.get_by_role("button", name="Start").click()
    # The refusal sits under the steps field.
    expect(dialog.locator(".field-invalid .field-error")).to_contain_text(
        "Steps must rise: step 2 (5%) is not above step 1 (10%)"
    )
    assert not Rollout.objects.exists()
    screenshot(page, "rollouts-start-refused", full_page=False)

    dialog.get_by_label("Steps (%)").fill("10, 50, 100")
    # A statistical gate beside the static ones: TTFT may be up to 50 % above the baseline's.
    dialog.get_by_label("TTFT tolerance (statistical)").fill("0.5")
    dialog.get_by_role("button", name="Start").click()
    expect(dialog).to_be_hidden()
    rollout = Rollout.objects.get()
    detail = page.get_by_test_id("rollout-detail")
    expect(detail).to_contain_text("llama-e2e")
    expect(page.get_by_test_id("rollout-share")).to_have_text("10%")
    expect(detail.get_by_test_id("rollout-steps").locator("li.current")).to_have_text("10%")
    expect(page.get_by_test_id("decisions-table")).to_contain_text("start")
    expect(page.get_by_test_id("gates-table")).to_contain_text("p95 latency, candidate / baseline")

    # Traffic in the step's window, as the proxy logs it; then one gate-task run.
    at = timezone.now()
    log_requests(c.alias, c.v1, 60, latency_ms=100, ttft_ms=20, at=at)
    log_requests(c.alias, c.v2, 25, latency_ms=105, ttft_ms=21, at=at)
    assert evaluate_all(at + dt.timedelta(seconds=1)) == {rollout.pk: "advance"}
    rollout.refresh_from_db()
    assert rollout.gates["ttft_tolerance"] == 0.5
    # The page follows on its own (it re-reads every two seconds).
    expect(page.get_by_test_id("rollout-share")).to_have_text("50%")
    expect(detail.get_by_test_id("rollout-steps").locator("li.current")).to_have_text("50%")
    decisions = page.get_by_test_id("decisions-table")
    expect(decisions.locator("tbody tr").first).to_contain_text("advance")
    expect(decisions.locator("tbody tr").first).to_contain_text("10% → 50%")
    expect(decisions.locator("tbody tr").first).to_contain_text("gate task")
    # Every candidate TTFT is 21 ms against 20: a shift of +5 %, well inside the 50 % tolerance.
    expect(page.get_by_test_id("gate-judgement-ttft_tolerance")).to_contain_text("Successful: shift +5.0%")
    chart = page.get_by_test_id("gate-chart-max_p95_latency_ratio")
    expect(chart).to_have_attribute("data-points", re.compile(r"[1-9]"))
    # Configured 50 % beside the request log's 25 of 85 (29.4 %).
    legend = page.get_by_test_id("split-card").locator("li[data-role=candidate]")
    expect(legend).to_have_attribute("data-configured", "50")
    expect(legend).to_contain_text("configured 50% / live 29.4%")
    screenshot(page, "rollouts-advanced")

    # The aliases page shows both versions serving and their shares, configured and live.
    page.goto("/models/aliases")
    row = page.get_by_test_id("aliases-table").locator("tbody tr", has_text="llama-e2e")
    expect(row.locator("li[data-role=active]")).to_contain_text("configured 50% / live 70.6%")
    expect(row.locator("li[data-role=candidate]")).to_contain_text(f"{c.v2}")
    expect(row.locator("li[data-role=candidate]")).to_contain_text("configured 50% / live 29.4%")
    expect(row).to_contain_text(f"rollout #{rollout.pk} (running)")

    page.goto(f"/rollouts?id={rollout.pk}")
    page.get_by_role("button", name="Roll back").click()
    page.get_by_label("Reason (optional)").fill("answers look off")
    page.get_by_role("dialog").get_by_role("button", name="Roll back").click()
    expect(page.get_by_test_id("rollout-share")).to_have_text("0%")
    expect(detail).to_contain_text("rolled_back")
    rows = page.get_by_test_id("decisions-table").locator("tbody tr")
    expect(rows).to_have_count(3)
    expect(rows.nth(0)).to_contain_text("rollback")
    expect(rows.nth(0)).to_contain_text("answers look off")
    expect(rows.nth(0)).to_contain_text(admin_user.username)
    expect(rows.nth(1)).to_contain_text("advance")
    expect(rows.nth(2)).to_contain_text("start")
    expect(page.get_by_role("button", name="Pause")).to_have_count(0)
    rollout.refresh_from_db()
    assert (rollout.state, rollout.share, rollout.reason) == ("rolled_back", 0.0, "answers look off")
    screenshot(page, "rollouts-rolled-back")


def test_viewer_reads_rollouts_without_write_actions(
    live_console: LiveConsole, browser_page: Any, viewer_user: User, redis_clean: None
) -> None:
    from routing.rollouts import services

    c = canary("llama-e2e")
    services.start_rollout(c.alias, c.v2, [5, 100], actor=None)
    page = browser_page
    login(page, viewer_user.username, PASSWORD)
    page.get_by_role("link", name="Rollouts").click()
    expect(page.get_by_test_id("rollout-detail")).to_contain_text("llama-e2e")
    expect(page.get_by_test_id("rollout-share")).to_have_text("5%")
    for name in ("Start rollout", "Pause", "Resume", "Promote", "Roll back", "New shadow"):
        expect(page.get_by_role("button", name=name)).to_have_count(0)
