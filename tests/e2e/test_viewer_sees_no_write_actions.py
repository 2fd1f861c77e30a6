"""In the browser, a viewer sees tenants, quotas and keys but no write action; the API refuses writes too."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from console.models import Quota, Tenant, User
from console.services import issue_api_key
from tests.conftest import PASSWORD
from tests.e2e.harness import LiveConsole, login, screenshot

pytestmark = pytest.mark.e2e


def test_viewer_sees_no_write_actions(
    live_console: LiveConsole, browser_page: Any, viewer_user: User, admin_user: User
) -> None:
    tenant = Tenant.objects.create(name="readonly-co")
    Quota.objects.create(tenant=tenant, requests_per_minute=77)
    issue_api_key(tenant=tenant, name="viewer-visible key", scopes=[], expires_at=None, created_by=admin_user)
    page = browser_page
    login(page, viewer_user.username, PASSWORD)
    expect(page.get_by_test_id("current-role")).to_have_text("viewer")

    page.get_by_role("link", name="Tenants").click()
    expect(page.get_by_test_id("tenants-table")).to_contain_text("readonly-co")
    expect(page.get_by_role("button", name="New tenant")).to_have_count(0)

    page.get_by_test_id("tenants-table").get_by_text("readonly-co").click()
    expect(page.get_by_test_id("tenant-quota")).to_contain_text("77")
    expect(page.get_by_test_id("keys-table")).to_contain_text("viewer-visible key")
    for name in ("Create key", "Edit", "Revoke", "Save quota", "Save settings", "Delete tenant"):
        expect(page.get_by_role("button", name=name)).to_have_count(0)
    screenshot(page, "viewer-tenant-detail-read-only")

    # Hiding buttons is a courtesy; the API is what refuses a viewer's write.
    status = page.evaluate(
        """async () => {
            const cookie = document.cookie.split('; ').find((c) => c.startsWith('csrftoken='));
            const csrf = cookie ? cookie.split('=')[1] : '';
            const response = await fetch('/api/tenants/', {
                method: 'POST',
                headers: {'Content-Type': 'application/json', 'X-CSRFToken': csrf},
                body: JSON.stringify({name: 'sneaky'}),
            });
            return response.status;
        }"""
    )
    assert status == 403
    assert not Tenant.objects.filter(name="sneaky").exists()
