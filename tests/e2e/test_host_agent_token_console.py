"""In the browser, an admin registers a host and gets its agent token exactly once, rotates it (the old
one stops working) and revokes it; the card shows only the token's prefix."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from console.models import User
from core.models import AuditEvent
from nodes.agent_tokens import hash_agent_token
from nodes.models import AgentToken
from tests.conftest import PASSWORD
from tests.e2e.harness import LiveConsole, login, screenshot
from tests.e2e.test_tenant_keys_console import page_text_and_values

pytestmark = pytest.mark.e2e


def test_admin_registers_a_host_rotates_and_revokes_its_agent_token(
    live_console: LiveConsole, browser_page: Any, admin_user: User
) -> None:
    page = browser_page
    login(page, admin_user.username, PASSWORD)
    page.get_by_role("link", name="Nodes").click()

    page.get_by_test_id("add-host-button").click()
    dialog = page.get_by_test_id("add-host-dialog")
    dialog.get_by_label("Name").fill("gpu-e2e")
    dialog.get_by_label("Address").fill("10.1.2.3")
    dialog.get_by_test_id("add-host-submit").click()
    secret = page.get_by_test_id("agent-token-secret")
    expect(secret).to_be_visible()
    first = secret.input_value()
    screenshot(page, "01-agent-token-shown-once")
    assert AgentToken.objects.get(host__name="gpu-e2e", revoked_at__isnull=True).hashed_token == (
        hash_agent_token(first)
    )
    page.get_by_role("button", name="I have stored the token").click()
    card = page.get_by_test_id("host-gpu-e2e")
    expect(card.get_by_test_id("agent-token-gpu-e2e")).to_contain_text(first[:12])
    assert first not in page_text_and_values(page)

    card.get_by_test_id("rotate-token-gpu-e2e").click()
    page.get_by_role("button", name="Issue a new token").click()
    expect(page.get_by_test_id("agent-token-secret")).to_be_visible()
    second = page.get_by_test_id("agent-token-secret").input_value()
    assert second != first
    page.get_by_role("button", name="I have stored the token").click()
    assert AgentToken.objects.get(hashed_token=hash_agent_token(first)).revoked_at is not None
    expect(card.get_by_test_id("agent-token-gpu-e2e")).to_contain_text(second[:12])

    card.get_by_test_id("revoke-token-gpu-e2e").click()
    page.get_by_role("button", name="Revoke", exact=True).click()
    expect(card.get_by_test_id("agent-token-gpu-e2e")).to_contain_text("none (its agent is refused)")
    screenshot(page, "02-agent-token-revoked")
    assert not AgentToken.objects.filter(host__name="gpu-e2e", revoked_at__isnull=True).exists()
    assert AuditEvent.objects.filter(object_type="nodes.agenttoken", action="create").count() == 2
    assert AuditEvent.objects.filter(action="revoke", object_repr="gpu-e2e").exists()
    assert second not in page_text_and_values(page)
