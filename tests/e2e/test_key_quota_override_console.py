"""In the browser, an admin gives one key its own quota (errors shown by the field), then removes it again."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from console.models import Quota, Tenant, User
from console.services import issue_api_key
from tests.conftest import PASSWORD
from tests.e2e.harness import login, screenshot

pytestmark = pytest.mark.e2e


def test_admin_sets_and_removes_a_key_quota_override(browser_page: Any, admin_user: User) -> None:
    tenant = Tenant.objects.create(name="override-co")
    api_key = issue_api_key(tenant=tenant, name="batch jobs", created_by=admin_user).api_key
    page = browser_page
    login(page, admin_user.username, PASSWORD)
    page.goto(f"/tenants/{tenant.pk}")

    row = page.get_by_test_id("keys-table").locator("tr", has_text="batch jobs")
    expect(row).to_contain_text("tenant's")
    row.get_by_role("button", name="Edit").click()
    dialog = page.get_by_test_id("edit-key-dialog")
    dialog.get_by_label("Own quota for this key").check()
    dialog.get_by_label("Tokens / minute").fill("1000")
    dialog.get_by_label("Max output tokens").fill("lots")
    dialog.get_by_role("button", name="Save key").click()
    bad_field = dialog.locator(".field", has=page.get_by_label("Max output tokens"))
    expect(bad_field.locator(".field-error")).to_contain_text("integer")
    screenshot(page, "key-quota-override-error", full_page=False)
    assert not Quota.objects.filter(api_key=api_key).exists()

    dialog.get_by_label("Max output tokens").fill("256")
    dialog.get_by_role("button", name="Save key").click()
    expect(dialog).to_be_hidden()
    expect(row).to_contain_text("own")
    override = Quota.objects.get(api_key=api_key)
    assert (override.tokens_per_minute, override.max_output_tokens, override.requests_per_minute) == (
        1000,
        256,
        None,
    )

    row.get_by_role("button", name="Edit").click()
    expect(dialog.get_by_label("Tokens / minute")).to_have_value("1000")
    dialog.get_by_label("Own quota for this key").uncheck()
    dialog.get_by_role("button", name="Save key").click()
    expect(row).to_contain_text("tenant's")
    assert not Quota.objects.filter(api_key=api_key).exists()
