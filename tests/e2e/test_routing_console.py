"""In the browser: the Routing page shows pools, rules and the traffic split and edits a pool's batch share;
the request log filters by tenant (picked by name), model and status, fits the console's width, opens a
request's details, and charts usage."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from console.models import Tenant, User
from routing.demo import seed_demo_routing
from routing.models import RequestLog, RoutePool
from tests.conftest import PASSWORD
from tests.e2e.harness import LiveConsole, login, screenshot

pytestmark = pytest.mark.e2e


def _log_rows() -> tuple[Tenant, Tenant]:
    """Twelve requests, alternating between two tenants (acme: even rows, globex: odd rows)."""
    acme = Tenant.objects.create(name="acme")
    globex = Tenant.objects.create(name="globex")
    now = timezone.now()
    rows = []
    for i in range(12):
        rows.append(
            RequestLog(
                created_at=now - timedelta(seconds=10 * i),
                request_id=f"req{i:03d}",
                tenant_id=(acme if i % 2 == 0 else globex).pk,
                tenant_name="acme" if i % 2 == 0 else "globex",
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
    # A chain's stages: req000 passed its guard and missed the cache; req008 was answered from the cache.
    rows[0].stages = [
        {"name": "prompt", "kind": "guard", "outcome": "pass", "ms": 0.05},
        {"name": "answers", "kind": "cache", "outcome": "miss", "ms": 0.4},
    ]
    rows[8].stages = [{"name": "answers", "kind": "cache", "outcome": "hit", "ms": 0.3}]
    rows[8].route_pool, rows[8].deployment_id, rows[8].route_reason = (
        "",
        None,
        "chain cached v1 (answers hit)",
    )
    rows[8].prompt_tokens, rows[8].completion_tokens = 0, 0  # a hit bills no tokens
    RequestLog.objects.bulk_create(rows)
    return acme, globex


def test_routing_and_request_log_pages(
    live_console: LiveConsole, browser_page: Any, admin_user: User
) -> None:
    seed_demo_routing()
    _acme, globex = _log_rows()
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
    # Every column, the batch share included, is visible at the test window's 1280 px.
    pools_size = pools.evaluate("el => [el.scrollWidth, el.clientWidth]")
    assert pools_size[0] <= pools_size[1], f"pools table overflows its card: {pools_size}"
    screenshot(page, "routing-page")

    # The batch share: listed per pool, edited in the pool dialog, refused outside 0..1 next to the field.
    fast_row = pools.locator("tbody tr", has_text="llama-fast")
    expect(fast_row.locator("td").last).to_have_text("80%")
    fast_row.click()
    dialog = page.get_by_test_id("pool-dialog")
    share = dialog.get_by_label("Batch share (0 to 1)")
    expect(share).to_have_value("0.8")
    share.fill("1.5")
    dialog.get_by_role("button", name="Save").click()
    expect(share).to_have_attribute("aria-invalid", "true")
    # The message is the one the field points at (aria-describedby), i.e. shown next to it.
    error_id = share.get_attribute("aria-describedby")
    expect(page.locator(f"[id='{error_id}']")).to_have_text("Ensure this value is less than or equal to 1.0.")
    screenshot(page, "routing-pool-batch-share-error", full_page=False)
    assert RoutePool.objects.get(name="llama-fast").batch_max_fraction == 0.8
    share.fill("0.5")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog).to_be_hidden()
    expect(fast_row.locator("td").last).to_have_text("50%")
    assert RoutePool.objects.get(name="llama-fast").batch_max_fraction == 0.5
    screenshot(page, "routing-pool-batch-share-saved")

    page.get_by_role("link", name="Request log").click()
    table = page.get_by_test_id("request-log-table")
    expect(table.locator("tbody tr")).to_have_count(12)
    expect(page.get_by_test_id("usage-card")).to_contain_text("12 requests")
    page.get_by_label("Status").select_option("500+")
    expect(table.locator("tbody tr")).to_have_count(1)
    expect(table).to_contain_text("upstream_disconnected")
    page.get_by_role("button", name="Clear filters").click()
    expect(table.locator("tbody tr")).to_have_count(12)

    # The tenant picker lists tenants by name; the choice is the tenant_id filter in the URL.
    page.get_by_label("Tenant", exact=True).select_option(label="globex")
    expect(table.locator("tbody tr")).to_have_count(6)
    for text in table.locator("tbody tr td:nth-child(2)").all_inner_texts():
        assert text == "globex"
    expect(page).to_have_url(f"{live_console.url}/requests?tenant_id={globex.pk}")
    expect(page.get_by_test_id("usage-card")).to_contain_text("Usage of tenant globex")
    expect(page.get_by_test_id("usage-card")).to_contain_text("6 requests")
    page.reload()
    expect(page.get_by_label("Tenant", exact=True)).to_have_value(str(globex.pk))
    expect(table.locator("tbody tr")).to_have_count(6)

    # At the console's usual width the whole table, Route column included, is visible without scrolling.
    page.set_viewport_size({"width": 1400, "height": 900})
    expect(table.locator("thead th").last).to_have_text("Route")
    sizes = table.evaluate("el => [el.scrollWidth, el.clientWidth]")
    assert sizes[0] <= sizes[1], f"request table overflows its box: {sizes}"
    route_cell = table.locator("tbody tr").first.locator("td").last
    expect(route_cell).to_be_in_viewport(ratio=1)
    expect(route_cell).to_have_text("llama-fast → #7")
    route_title = re.compile("least_outstanding inflight=0")
    expect(route_cell.locator("[title]")).to_have_attribute("title", route_title)
    screenshot(page, "request-log-tenant-filter")
    page.set_viewport_size({"width": 1280, "height": 860})

    page.get_by_role("button", name="Clear filters").click()
    page.get_by_label("Model alias").fill("smollm2-135m")
    expect(table.locator("tbody tr")).to_have_count(3)
    table.locator("tbody tr").first.click()
    dialog = page.get_by_test_id("request-dialog")
    expect(dialog).to_contain_text("req000")
    expect(dialog).to_contain_text("least_outstanding")
    stages = page.get_by_test_id("request-stages")
    expect(stages).to_contain_text("prompt (guard): pass")
    expect(stages).to_contain_text("answers (cache): miss, 0.4 ms")
    screenshot(page, "request-log-detail", full_page=False)
    dialog.get_by_role("button", name="Close").last.click()
    # An answer replayed by the cache stage: no pool and no engine, "cache hit" in the route column.
    expect(table.locator("tbody tr").nth(2).locator("td").last).to_have_text("cache hit · answers")
