"""The New alias dialog, opened before the page's versions have arrived, creates the alias on the first
version once they come, as the select shows it, instead of sending none."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from console.models import User
from models_registry.models import Model, ModelAlias, ModelVersion
from tests.conftest import PASSWORD
from tests.e2e.harness import login

pytestmark = pytest.mark.e2e


def test_new_alias_opened_before_versions_load_takes_the_first(browser_page: Any, admin_user: User) -> None:
    model = Model.objects.create(name="SmolLM2-135M-Instruct")
    version = ModelVersion.objects.create(
        model=model,
        revision="q4_1",
        source_kind="gguf",
        source_path="/srv/models/smollm2-135m-instruct-q4_1.gguf",
        state="verified",
    )
    page = browser_page
    login(page, admin_user.username, PASSWORD)

    # The page's list of versions is held back until the dialog is open and filled in.
    held: list[Any] = []
    versions_url = re.compile(r"/api/model-versions/\?")

    def hold(route: Any) -> None:
        held.append(route)

    page.route(versions_url, hold)
    page.goto("/models/aliases")
    page.get_by_role("button", name="New alias").click()
    dialog = page.get_by_test_id("alias-dialog")
    dialog.get_by_label("Alias").fill("smol-chat")
    for _ in range(100):  # the route handler runs while Playwright waits; at most 5 s
        if held:
            break
        page.wait_for_timeout(50)
    assert held, "the console did not ask for the versions"
    # Nothing to pick yet: the select is empty while the list is held.
    expect(dialog.get_by_label("Version").locator("option")).to_have_count(0)
    for route in held:
        route.continue_()
    page.unroute(versions_url, hold)

    # The browser shows the first option whatever the form holds; what it sends is what counts.
    expect(dialog.get_by_label("Version")).to_have_value(str(version.pk))
    dialog.get_by_role("button", name="Create alias").click()
    expect(dialog).to_be_hidden()
    alias = ModelAlias.objects.get(name="smol-chat")
    assert alias.active_version_id == version.pk
    expect(page.get_by_test_id("aliases-table")).to_contain_text("smol-chat")
