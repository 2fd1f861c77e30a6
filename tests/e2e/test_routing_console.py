"""In the browser: the Routing page shows pools, rules and the traffic split; the request log filters
by model and status, opens a request's details, and charts usage."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from console.models import User
from routing.demo import seed_demo_routing
from routing.models import RequestLog
from tests.conftest import PASSWORD
from tests.e2e.harness import LiveConsole, login, screenshot

pytestmark = pytest.mark.e2e


def _log_rows() -> None:
    now = timezone.now()
    rows = []
    for i in range(12):
        rows.append(
            RequestLog(
                created_at=now - timedelta(seconds=10 * i),
                request_id=f"req{i:03d}",
                tenant_id=1,
                tenant_name="demo",
                key_prefix="ick_abcdefgh",
                endpoint_kind="chat",
                alias="llama-3.1-8b" if i % 4 else "smollm2-135m",
                deployment_id=7 if i % 2 else 8,
                status=200 if i != 3 else 502,
                error_type="" if i != 3 else "upstream_disconnected",
                prompt_tokens=20 + i,
                completion_tokens=5,
                ttft_ms=12.5,
                latency_ms=80.0,
                route_pool="llama-fast",
                route_reason="policy llama by prompt length rule 1; least_outstanding inflight=0",
            )
        )
    RequestLog.objects.bulk_create(rows)


def test_routing_and_request_log_pages(
    live_console: LiveConsole, browser_page: Any, admin_user: User
) -> None:
    seed_demo_routing()
    _log_rows()
    page = browser_page
    login(page, admin_user.username, PASSWORD)

    page.get_by_role("link", name="Routing").click()
    pools = page.get_by_test_id("pools-table")
    expect(pools).to_contain_text("llama-fast")
    expect(pools).to_contain_text("best fit")
    policy = page.get_by_test_id("policy-llama-3.1-8b")
    expect(policy).to_contain_text("if task is summarize → llama-long")
    expect(policy).to_contain_text("if prompt ≤ 6000 tokens → llama-fast")
    expect(page.get_by_test_id("traffic-row")).to_have_count(2)
    expect(page.get_by_test_id("traffic-card")).to_contain_text("deployment #7")
    screenshot(page, "routing-page")

    page.get_by_role("link", name="Request log").click()
    table = page.get_by_test_id("request-log-table")
    expect(table.locator("tbody tr")).to_have_count(12)
    expect(page.get_by_test_id("usage-card")).to_contain_text("12 requests")
    page.get_by_label("Status").select_option("500+")
    expect(table.locator("tbody tr")).to_have_count(1)
    expect(table).to_contain_text("upstream_disconnected")
    page.get_by_role("button", name="Clear filters").click()
    page.get_by_label("Model alias").fill("smollm2-135m")
    expect(table.locator("tbody tr")).to_have_count(3)
    table.locator("tbody tr").first.click()
    dialog = page.get_by_test_id("request-dialog")
    expect(dialog).to_contain_text("req000")
    expect(dialog).to_contain_text("least_outstanding")
    screenshot(page, "request-log-detail", full_page=False)
