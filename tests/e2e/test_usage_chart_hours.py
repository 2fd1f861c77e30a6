"""In the browser: the request log's usage chart draws each hour at its own place in the last 24, so
consecutive hours sit side by side (they were drawn by index: two hours, half the chart apart)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from console.models import Tenant, User
from routing.models import RequestLog
from tests.conftest import PASSWORD
from tests.e2e.harness import LiveConsole, login

pytestmark = pytest.mark.e2e


def test_usage_bars_sit_at_their_hours(
    live_console: LiveConsole, browser_page: Any, admin_user: User
) -> None:
    tenant = Tenant.objects.create(name="acme")
    now = timezone.now()
    this_hour = now.replace(minute=0, second=0, microsecond=0)
    # Requests in this hour, the hour before it and five hours before it (none in between).
    at = [now, this_hour - timedelta(minutes=30), this_hour - timedelta(hours=4, minutes=30)]
    RequestLog.objects.bulk_create(
        RequestLog(
            created_at=when,
            request_id=f"usage-{i}",
            tenant_id=tenant.pk,
            tenant_name=tenant.name,
            endpoint_kind="chat",
            alias="llama",
            status=200,
            prompt_tokens=10,
            completion_tokens=5,
            latency_ms=50.0,
        )
        for i, when in enumerate(at)
    )
    page = browser_page
    login(page, admin_user.username, PASSWORD)
    page.goto("/requests")
    card = page.get_by_test_id("usage-card")
    expect(card).to_contain_text("3 requests")
    bars = card.get_by_test_id("usage-bar")
    expect(bars).to_have_count(3)
    slots = sorted(int(s) for s in bars.evaluate_all("els => els.map(e => e.dataset.slot)"))
    # The last slot is the hour now running; the others by how many hours before it they are.
    assert slots == [18, 22, 23], slots
    xs = {
        int(slot): float(x)
        for slot, x in bars.evaluate_all(
            "els => els.map(e => [e.dataset.slot, e.querySelector('rect.req').getAttribute('x')])"
        )
    }
    slot_width = xs[23] - xs[22]
    assert slot_width > 0 and abs((xs[22] - xs[18]) - 4 * slot_width) < 0.01, xs
