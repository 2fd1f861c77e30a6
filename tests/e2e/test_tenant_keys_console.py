"""In the browser, an admin creates a tenant, sets its quota, creates a key shown exactly once, revokes it."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from console.models import ApiKey, Quota, Tenant, User
from console.services import hash_api_key
from core.models import AuditEvent
from tests.conftest import PASSWORD
from tests.e2e.harness import LiveConsole, login, screenshot

pytestmark = pytest.mark.e2e


def page_text_and_values(page: Any) -> str:
    """Everything a user could read or copy from the page: the HTML plus the live values of form controls."""
    values = page.evaluate(
        "() => [...document.querySelectorAll('input, textarea')].map(e => e.value).join('\\n')"
    )
    return f"{page.content()}\n{values}"


def test_admin_creates_tenant_sets_quota_creates_key_once_and_revokes(
    live_console: LiveConsole, browser_page: Any, admin_user: User
) -> None:
    page = browser_page
    login(page, admin_user.username, PASSWORD)
    screenshot(page, "01-signed-in-dashboard")

    # Create the tenant from the list page; the console opens its detail page.
    page.get_by_role("link", name="Tenants").click()
    page.get_by_role("button", name="New tenant").click()
    dialog = page.get_by_test_id("create-tenant-dialog")
    dialog.get_by_label("Name").fill("acme-e2e")
    dialog.get_by_label("Description").fill("Created by the end-to-end test")
    dialog.get_by_role("button", name="Create tenant").click()
    expect(page.get_by_role("heading", name="acme-e2e")).to_be_visible()
    tenant = Tenant.objects.get(name="acme-e2e")
    assert tenant.description == "Created by the end-to-end test"
    assert page.url.endswith(f"/tenants/{tenant.pk}")

    # A bad quota value is refused by the API and the error shows next to its field.
    quota = page.get_by_test_id("tenant-quota")
    quota.get_by_label("Requests / minute").fill("120")
    quota.get_by_label("Tokens / minute").fill("50000")
    quota.get_by_label("Concurrent requests").fill("-4")
    quota.get_by_role("button", name="Save quota").click()
    concurrent_field = quota.locator(".field", has=page.get_by_label("Concurrent requests"))
    expect(concurrent_field.locator(".field-error")).to_be_visible()
    screenshot(page, "02-quota-field-error")
    assert Quota.objects.filter(tenant=tenant).first() is None  # nothing half-saved

    quota.get_by_label("Concurrent requests").fill("4")
    quota.get_by_role("button", name="Save quota").click()
    expect(quota.get_by_text("Quota saved.")).to_be_visible()
    saved = Quota.objects.get(tenant=tenant)
    assert saved.requests_per_minute == 120
    assert saved.tokens_per_minute == 50000
    assert saved.max_concurrent_requests == 4
    assert saved.daily_token_budget is None  # left empty: unlimited
    screenshot(page, "03-tenant-quota-saved")

    # Create a key: the dialog shows the secret, and it is the key the server stored the hash of.
    keys = page.get_by_test_id("tenant-keys")
    keys.get_by_role("button", name="Create key").click()
    create = page.get_by_test_id("create-key-dialog")
    create.get_by_label("Name").fill("e2e key")
    create.get_by_role("button", name="Create key").click()
    secret_dialog = page.get_by_test_id("new-key-dialog")
    expect(secret_dialog).to_be_visible()
    secret = page.get_by_test_id("new-key-secret").input_value()
    api_key = ApiKey.objects.get(tenant=tenant, name="e2e key")
    assert secret.startswith(api_key.prefix)
    assert hash_api_key(secret) == api_key.hashed_key
    # The screenshot masks the secret: artifacts are files on disk, and a raw key is never stored.
    screenshot(
        page, "04-key-created-shown-once", full_page=False, mask=[page.get_by_test_id("new-key-secret")]
    )

    # Escape does not dismiss it by accident; the explicit button does, and the secret is gone for good.
    page.keyboard.press("Escape")
    expect(secret_dialog).to_be_visible()
    secret_dialog.get_by_role("button", name="I have stored the key").click()
    expect(secret_dialog).to_be_hidden()
    row = page.get_by_test_id("keys-table").locator("tr", has_text="e2e key")
    expect(row).to_contain_text(f"{api_key.prefix}…")
    expect(row).to_contain_text("active")
    assert secret not in page_text_and_values(page)
    page.reload()
    expect(page.get_by_test_id("keys-table").locator("tr", has_text="e2e key")).to_be_visible()
    assert secret not in page_text_and_values(page)
    screenshot(page, "05-key-listed-secret-gone")

    # Revoke it through the confirmation dialog.
    key_row = page.get_by_test_id("keys-table").locator("tr", has_text="e2e key")
    key_row.get_by_role("button", name="Revoke").click()
    page.get_by_role("button", name="Revoke key").click()
    revoked_row = key_row
    expect(revoked_row).to_contain_text("revoked")
    expect(revoked_row.get_by_role("button", name="Revoke")).to_have_count(0)
    api_key.refresh_from_db()
    assert api_key.revoked_at is not None
    screenshot(page, "06-key-revoked")

    # The audit log shows the revocation, found with its filters.
    page.get_by_role("link", name="Audit").click()
    page.get_by_label("Action").select_option("revoke")
    table = page.get_by_test_id("audit-table")
    expect(table.locator("tbody tr")).to_have_count(1)
    expect(table).to_contain_text("e2e key")
    expect(table).to_contain_text(admin_user.username)
    assert AuditEvent.objects.filter(action="revoke", object_id=str(api_key.pk)).count() == 1
    screenshot(page, "07-audit-filtered-revoke")
