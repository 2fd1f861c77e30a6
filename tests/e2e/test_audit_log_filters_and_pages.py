"""In the browser, the audit log pages through events and filters by action, object type, actor and time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from playwright.sync_api import expect

from console.models import User
from core.models import AuditEvent
from tests.conftest import PASSWORD
from tests.e2e.harness import LiveConsole, login, screenshot

pytestmark = pytest.mark.e2e


def shown(first: int, last: int, count: int) -> str:
    """The pager's range text, e.g. "1-25 of 33" (with an en dash)."""
    return f"{first}\u2013{last} of {count}"


def test_audit_log_filters_and_pages(live_console: LiveConsole, browser_page: Any, admin_user: User) -> None:
    # 30 tenant updates by the admin yesterday, 3 key revocations by "bob" long ago.
    yesterday = datetime.now(UTC) - timedelta(days=1)
    for i in range(30):
        AuditEvent.objects.create(
            actor=admin_user,
            actor_name=admin_user.username,
            action="update",
            object_type="console.tenant",
            object_id=str(i),
            object_repr=f"tenant-{i:02d}",
            before={"description": "old"},
            after={"description": f"new {i}"},
            created_at=yesterday + timedelta(minutes=i),
        )
    old = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
    for i in range(3):
        AuditEvent.objects.create(
            actor_name="bob",
            action="revoke",
            object_type="console.apikey",
            object_id=str(100 + i),
            object_repr=f"bob key {i}",
            created_at=old + timedelta(hours=i),
        )

    page = browser_page
    login(page, admin_user.username, PASSWORD)
    page.get_by_role("link", name="Audit").click()
    table = page.get_by_test_id("audit-table")
    rows = table.locator("tbody tr")

    # Newest first, 25 a page.
    expect(page.get_by_test_id("pagination-range")).to_have_text(shown(1, 25, 33))
    expect(rows).to_have_count(25)
    expect(rows.first).to_contain_text("tenant-29")
    expect(rows.first).to_contain_text("description")  # the changed field
    screenshot(page, "audit-log-page-1")
    page.get_by_role("button", name="Next →").click()
    expect(page.get_by_test_id("pagination-range")).to_have_text(shown(26, 33, 33))
    expect(rows).to_have_count(8)
    expect(table).to_contain_text("bob key 0")

    # Filters narrow the list and reset to the first page.
    page.get_by_label("Actor").fill("bob")
    expect(page.get_by_test_id("pagination-range")).to_have_text(shown(1, 3, 3))
    page.get_by_label("Actor").fill("")
    page.get_by_label("Object type").fill("console.apikey")
    expect(rows).to_have_count(3)
    page.get_by_label("Object type").fill("")
    page.get_by_label("Action").select_option("update")
    expect(page.get_by_test_id("pagination-range")).to_have_text(shown(1, 25, 30))

    # Time range: only bob's events fall before 2024-03-01 13:30 (the browser runs in UTC).
    page.get_by_label("Action").select_option("")
    page.get_by_label("From").fill("2024-03-01T12:30")
    page.get_by_label("Until").fill("2024-03-01T13:30")
    expect(rows).to_have_count(1)
    expect(table).to_contain_text("bob key 1")
    screenshot(page, "audit-log-time-filtered")

    # An event opens with its before and after.
    page.get_by_role("button", name="Clear filters").click()
    expect(page.get_by_test_id("pagination-range")).to_have_text(shown(1, 25, 33))
    rows.first.click()
    dialog = page.get_by_test_id("audit-event-dialog")
    expect(dialog).to_contain_text('"description": "old"')
    expect(dialog).to_contain_text('"description": "new 29"')
    screenshot(page, "audit-event-before-after", full_page=False)
