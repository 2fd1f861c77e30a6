"""In the browser: the deployment, routing and tenant pages show the cost figures of the hand-worked case
(tests/routing/cost_scenario.py) over the last 24 hours."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from console.models import User
from tests.conftest import PASSWORD
from tests.e2e.harness import LiveConsole, login, screenshot
from tests.routing.cost_scenario import build

pytestmark = pytest.mark.e2e


def test_cost_figures_on_deployment_pool_and_tenant_pages(
    live_console: LiveConsole, browser_page: Any, admin_user: User
) -> None:
    # Over the last 24 h (the console's window) the whole scenario counts: chat-a ran end-10h to end-1h,
    # 8 x 1/2 x 9 = $36 over its 2,000,000 tokens = $18/M; idle-c's hour before it failed, 8 x 1/4 x 1 =
    # $2, splits over chat-fast and chat-long (both match it, neither routed to it); cpu-d ran 18 h, $18
    # over 200,000 tokens = $90/M. chat-fast: 36 x 3/4 + 6 (chat-b) + 4 (spare-e) + 1 = $38 over 2.0M =
    # $19/M; chat-long: 36 x 1/4 + 1 = $10 over 0.5M = $20/M. acme: 1.5M x 19/M + 0.5M x 20/M = $38.50.
    scenario = build(timezone.now())
    page = browser_page
    login(page, admin_user.username, PASSWORD)

    page.goto(f"/nodes/deployments/{scenario.deployments['chat-a'].pk}")
    card = page.get_by_test_id("deployment-cost")
    expect(card.get_by_test_id("deployment-cost-per-million")).to_have_text("$18.00 / M tokens")
    expect(card.get_by_test_id("deployment-cost-total")).to_have_text("$36.00")
    expect(card).to_contain_text("over 9.0 h · 2,000,000 output tokens · 2 of 4 GPUs of gpu-a at $8.00/h")
    screenshot(page, "cost-deployment")

    page.goto("/routing")
    table = page.get_by_test_id("pool-cost-table")
    chat_fast = table.locator("tbody tr", has_text="chat-fast")
    expect(chat_fast).to_contain_text("chat-a, chat-b, idle-c, spare-e")
    expect(chat_fast.locator("td").last).to_have_text("$19.00")
    expect(table.locator("tbody tr", has_text="chat-long").locator("td").last).to_have_text("$20.00")
    small = table.locator("tbody tr", has_text="small")
    expect(small.locator("td").first).to_have_text("small (implicit)")
    expect(small.locator("td").last).to_have_text("$90.00")
    screenshot(page, "cost-pools")

    page.goto(f"/tenants/{scenario.tenants['acme'].pk}")
    usage = page.get_by_test_id("tenant-usage")
    expect(usage.get_by_test_id("tenant-spend")).to_have_text("$38.50")
    expect(usage.get_by_test_id("tenant-budget-used")).to_contain_text(
        "1,000,000 of 4,000,000 tokens (25% of the daily budget)"
    )
    expect(usage.get_by_test_id("tenant-spend-by-pool")).to_contain_text("chat-long500,000$10.00")
    screenshot(page, "cost-tenant")
