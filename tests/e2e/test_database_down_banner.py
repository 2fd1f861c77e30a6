"""In the browser, an API that answers 503 `database_unavailable` puts up a banner that says so (the
server side of it is tests/routing/test_fault_postgres_down.py), and the banner goes away by itself."""

from __future__ import annotations

import json
from typing import Any

import pytest
from playwright.sync_api import expect

from console.models import User
from core.api.errors import DATABASE_DOWN_DETAIL
from tests.conftest import PASSWORD
from tests.e2e.harness import login

pytestmark = pytest.mark.e2e


def test_database_outage_banner(browser_page: Any, admin_user: User) -> None:
    page = browser_page
    login(page, admin_user.username, PASSWORD)
    body = json.dumps({"detail": DATABASE_DOWN_DETAIL, "code": "database_unavailable"})
    held: list[Any] = []
    database_is_down = False

    def api(route: Any) -> None:
        if database_is_down:
            route.fulfill(
                status=503, content_type="application/json", headers={"Retry-After": "5"}, body=body
            )
        elif not held:
            held.append(route)  # sent before the outage, answered after it (below)
        else:
            route.continue_()

    page.route("**/api/**", api)
    page.get_by_role("link", name="Tenants").click()
    while not held:
        page.wait_for_timeout(50)
    database_is_down = True
    page.get_by_role("link", name="Audit").click()
    # The banner, not the page's own error box (which says why the page is empty, below).
    banner = page.get_by_test_id("database-banner")
    expect(banner).to_be_visible()
    expect(banner).to_have_attribute("role", "alert")
    expect(banner).to_contain_text("The database is unavailable")
    expect(page.get_by_text(DATABASE_DOWN_DETAIL).first).to_be_visible()  # the page says why it is empty

    # A request sent before the outage and answered late says nothing about now: the banner stays.
    with page.expect_response(held[0].request.url):
        held[0].continue_()
    page.wait_for_timeout(300)
    expect(banner).to_be_visible()

    page.unroute("**/api/**")
    expect(banner).to_be_hidden(timeout=15_000)  # it asks again every 5 s; the first answer clears it
