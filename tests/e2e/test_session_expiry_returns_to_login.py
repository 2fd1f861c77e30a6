"""In the browser, a session ended on the server sends the user to sign in, then back where they were."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.sessions.models import Session
from playwright.sync_api import expect

from console.models import User
from tests.conftest import PASSWORD
from tests.e2e.harness import login

pytestmark = pytest.mark.e2e


def test_expired_session_goes_to_login_and_returns(browser_page: Any, admin_user: User) -> None:
    page = browser_page
    login(page, admin_user.username, PASSWORD)
    page.get_by_role("link", name="Tenants").click()
    expect(page.get_by_test_id("tenants-table")).to_contain_text("No tenants yet.")  # loaded, not loading

    Session.objects.all().delete()  # the session ends on the server (expiry, logout elsewhere)
    page.get_by_role("link", name="Audit").click()  # the next API call gets 401
    expect(page.get_by_role("heading", name="Sign in to the console")).to_be_visible()
    assert page.url.endswith("/login?next=%2Faudit")

    page.get_by_label("Username").fill(admin_user.username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Audit log")).to_be_visible()
    assert page.url.endswith("/audit")
