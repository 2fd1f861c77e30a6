"""The Routing page's traffic card: requests refused before routing are listed apart, by reason, with no
bar; the pools' bars share only the traffic that was routed."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from console.models import User
from routing.models import RequestLog
from tests.conftest import PASSWORD
from tests.e2e.harness import login, screenshot

pytestmark = pytest.mark.e2e


def test_refused_requests_are_not_drawn_as_traffic(browser_page: Any, admin_user: User) -> None:
    now = timezone.now()
    routed = [
        RequestLog(created_at=now, status=200, route_pool="llama-fast", deployment_id=7, upstream="http://a")
        for _ in range(3)
    ] + [
        RequestLog(created_at=now, status=200, route_pool="llama-fast", deployment_id=8, upstream="http://b")
    ]
    refused = [RequestLog(created_at=now, status=429, error_type="rate_limit_exceeded") for _ in range(40)]
    refused += [
        RequestLog(created_at=now, status=400, error_type="context_length_exceeded") for _ in range(2)
    ]
    RequestLog.objects.bulk_create(routed + refused)

    page = browser_page
    login(page, admin_user.username, PASSWORD)
    page.goto("/routing")
    card = page.get_by_test_id("traffic-card")
    pool = page.get_by_test_id("traffic-pool-llama-fast")
    expect(pool).to_contain_text("4 requests")
    # Bars are the routed requests only: 3 of 4 and 1 of 4, whatever was refused meanwhile.
    rows = card.get_by_test_id("traffic-row")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text("75% · 3 req")
    expect(rows.nth(1)).to_contain_text("25% · 1 req")
    bar_widths = [
        rows.nth(i).locator(".traffic-bar > span").evaluate("el => el.style.width") for i in range(2)
    ]
    assert bar_widths == ["75%", "25%"], bar_widths

    refused_box = page.get_by_test_id("traffic-refused")
    expect(refused_box).to_contain_text("Refused before routing")
    expect(refused_box).to_contain_text("42 requests")
    expect(refused_box.get_by_test_id("refused-row")).to_have_count(2)
    expect(refused_box.get_by_test_id("refused-row").first).to_contain_text(
        "429 rate_limit_exceeded · 40 req"
    )
    # Not drawn as traffic: no bar, and no share of a pool.
    expect(refused_box.locator(".traffic-bar")).to_have_count(0)
    expect(refused_box).not_to_contain_text("%")
    screenshot(page, "routing-refused-apart")
