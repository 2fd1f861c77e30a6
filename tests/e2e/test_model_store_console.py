"""In the browser, an admin adds an HTTP model store (a bad URL is shown on its field), then a second one,
and makes that one active: the table shows which store agents fetch from."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from console.models import User
from models_registry.models import ModelStore
from tests.conftest import PASSWORD
from tests.e2e.harness import login, screenshot

pytestmark = pytest.mark.e2e


def test_admin_adds_a_store_and_switches_the_active_one(browser_page: Any, admin_user: User) -> None:
    page = browser_page
    login(page, admin_user.username, PASSWORD)
    page.goto("/models")
    page.get_by_role("link", name="Model store").click()
    table = page.get_by_test_id("model-stores")
    expect(table).to_contain_text("No model store")

    page.get_by_role("button", name="New model store").click()
    dialog = page.get_by_test_id("store-dialog")
    dialog.get_by_label("Name").fill("rack-a")
    dialog.get_by_label("Location").fill("ftp://10.0.0.5/store")
    dialog.get_by_role("button", name="Create store").click()
    bad_field = dialog.locator(".field", has=page.get_by_label("Location"))
    expect(bad_field.locator(".field-error")).to_contain_text("base URL")
    assert not ModelStore.objects.exists()

    dialog.get_by_label("Location").fill("http://10.0.0.5:8080/store")
    dialog.get_by_role("button", name="Create store").click()
    expect(dialog).to_be_hidden()
    row_a = table.locator("tr", has_text="rack-a")
    expect(row_a).to_contain_text("active")

    page.get_by_role("button", name="New model store").click()
    dialog.get_by_label("Name").fill("minio")
    dialog.get_by_label("Kind").select_option("s3")
    dialog.get_by_label("Location").fill("models-bucket/prod")
    dialog.get_by_label("Endpoint URL").fill("http://minio.internal:9000")
    dialog.get_by_label("Active (agents fetch from it)").uncheck()
    dialog.get_by_role("button", name="Create store").click()
    expect(dialog).to_be_hidden()
    row_b = table.locator("tr", has_text="minio")
    expect(row_b).to_contain_text("inactive")

    row_b.get_by_role("button", name="Make active").click()
    expect(row_a).to_contain_text("inactive")
    expect(row_a.get_by_role("button", name="Make active")).to_be_visible()
    screenshot(page, "model-stores", full_page=False)
    assert list(ModelStore.objects.filter(is_active=True).values_list("name", flat=True)) == ["minio"]
