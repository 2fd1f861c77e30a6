"""In the browser, an admin creates a tenant (its limits prefilled with the defaults), sets its quota, creates
a key shown exactly once and one scoped to an alias, and revokes a key."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from console.models import ApiKey, Quota, Tenant, User
from console.services import default_tenant_quota, hash_api_key
from core.models import AuditEvent
from tests.conftest import PASSWORD
from tests.console.factories import make_alias
from tests.e2e.harness import LiveConsole, login, screenshot

pytestmark = pytest.mark.e2e

# The quota boxes' labels (frontend/src/api/types.ts QUOTA_FIELDS).
LIMIT_LABELS = {
    "requests_per_minute": "Requests / minute",
    "tokens_per_minute": "Tokens / minute",
    "max_concurrent_requests": "Concurrent requests",
    "daily_token_budget": "Daily token budget",
    "max_input_tokens": "Max input tokens",
    "max_output_tokens": "Max output tokens",
}


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

    # Create the tenant from the list page (its limits left at the defaults); the console opens its page.
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
    defaults = Quota.objects.get(tenant=tenant).limits()
    assert defaults == default_tenant_quota()

    # A bad quota value is refused by the API and the error shows next to its field.
    quota = page.get_by_test_id("tenant-quota")
    quota.get_by_label("Requests / minute").fill("120")
    quota.get_by_label("Tokens / minute").fill("50000")
    quota.get_by_label("Concurrent requests").fill("-4")
    quota.get_by_role("button", name="Save quota").click()
    concurrent_field = quota.locator(".field", has=page.get_by_label("Concurrent requests"))
    expect(concurrent_field.locator(".field-error")).to_be_visible()
    screenshot(page, "02-quota-field-error")
    assert Quota.objects.get(tenant=tenant).limits() == defaults  # nothing half-saved

    quota.get_by_label("Concurrent requests").fill("4")
    quota.get_by_label("Daily token budget").fill("")
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


def test_new_tenant_dialog_prefills_the_default_limits_and_a_key_is_scoped_to_one_alias(
    live_console: LiveConsole, browser_page: Any, admin_user: User
) -> None:
    make_alias("chat-small")
    make_alias("chat-large")
    defaults = default_tenant_quota()
    page = browser_page
    login(page, admin_user.username, PASSWORD)

    # The dialog asks for the limits, each box prefilled with the default (empty: no limit).
    page.goto("/tenants")
    page.get_by_role("button", name="New tenant").click()
    dialog = page.get_by_test_id("create-tenant-dialog")
    limits = dialog.get_by_test_id("create-tenant-quota")
    for name, label in LIMIT_LABELS.items():
        value = defaults[name]
        expect(limits.get_by_label(label)).to_have_value("" if value is None else str(value))
    screenshot(page, "tenant-dialog-default-limits", full_page=False)
    dialog.get_by_label("Name").fill("scoped-e2e")
    limits.get_by_label("Requests / minute").fill("abc")
    dialog.get_by_role("button", name="Create tenant").click()
    bad = limits.locator(".field", has=page.get_by_label("Requests / minute"))
    expect(bad.locator(".field-error")).to_contain_text("integer")
    assert not Tenant.objects.filter(name="scoped-e2e").exists()
    limits.get_by_label("Requests / minute").fill("30")
    limits.get_by_label("Daily token budget").fill("")
    dialog.get_by_role("button", name="Create tenant").click()
    expect(page.get_by_role("heading", name="scoped-e2e")).to_be_visible()
    tenant = Tenant.objects.get(name="scoped-e2e")
    assert Quota.objects.get(tenant=tenant).limits() == {
        **defaults,
        "requests_per_minute": 30,
        "daily_token_budget": None,
    }
    expect(page.get_by_test_id("tenant-quota").get_by_label("Requests / minute")).to_have_value("30")

    # A key scoped to one alias, picked from the aliases the proxy can route.
    page.get_by_test_id("tenant-keys").get_by_role("button", name="Create key").click()
    create = page.get_by_test_id("create-key-dialog")
    create.get_by_label("Name").fill("small only")
    picker = create.get_by_test_id("scope-picker")
    expect(picker.get_by_label("Every model, including ones added later")).to_be_checked()
    picker.get_by_label("Only the models ticked").check()
    create.get_by_role("button", name="Create key").click()  # none ticked: refused before it is sent
    expect(create.locator(".form-error")).to_contain_text("Tick at least one model")
    picker.get_by_label("chat-small").check()
    screenshot(page, "key-dialog-scoped-to-one-alias", full_page=False)
    create.get_by_role("button", name="Create key").click()
    page.get_by_test_id("new-key-dialog").get_by_role("button", name="I have stored the key").click()
    api_key = ApiKey.objects.get(tenant=tenant, name="small only")
    assert api_key.scopes == ["chat-small"]
    row = page.get_by_test_id("keys-table").locator("tr", has_text="small only")
    expect(row).to_contain_text("chat-small")
    expect(row).not_to_contain_text("chat-large")

    # The edit dialog shows the scope as saved; widening it is saved as a list.
    row.get_by_role("button", name="Edit").click()
    edit = page.get_by_test_id("edit-key-dialog")
    expect(edit.get_by_label("Only the models ticked")).to_be_checked()
    expect(edit.get_by_label("chat-small")).to_be_checked()
    expect(edit.get_by_label("chat-large")).not_to_be_checked()
    edit.get_by_label("chat-large").check()
    edit.get_by_role("button", name="Save key").click()
    expect(edit).to_be_hidden()
    expect(row).to_contain_text("chat-large, chat-small")
    api_key.refresh_from_db()
    assert api_key.scopes == ["chat-large", "chat-small"]
