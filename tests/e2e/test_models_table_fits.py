"""The Models page's versions table fits a 1440 px wide window: no column is pushed out of its box."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from console.models import User
from models_registry.models import Model, ModelAlias, ModelVersion, QuantizationConfig
from tests.conftest import PASSWORD
from tests.e2e.harness import login, screenshot

pytestmark = pytest.mark.e2e


def _versions() -> None:
    """Versions as the demo has them, with the longest names and values the table shows."""
    llama = Model.objects.create(name="Llama-3.1-8B-Instruct", architecture="LlamaForCausalLM")
    smol = Model.objects.create(name="SmolLM2-135M-Instruct", architecture="llama")
    awq = QuantizationConfig.objects.create(name="awq-int4-g128", method="awq", bits=4, group_size=128)
    q8 = QuantizationConfig.objects.create(name="gguf-q8_0", method="gguf-q8_0", bits=8)
    fp16 = ModelVersion.objects.create(
        model=llama,
        revision="fp16",
        source_kind="directory",
        source_path="/srv/models/demo/meta-llama--Llama-3.1-8B-Instruct/fp16",
        parameter_count=8_030_261_248,
        max_context=131_072,
        state="verified",
        file_count=7,
        total_bytes=16_060_522_496,
    )
    ModelVersion.objects.create(
        model=llama,
        revision="awq-int4-g128-2024-07-23",
        source_kind="directory",
        source_path="/srv/models/demo/hugging-quants--Meta-Llama-3.1-8B-Instruct-AWQ-INT4",
        parameter_count=8_030_261_248,
        max_context=131_072,
        state="registered",
        file_count=12,
        total_bytes=5_733_781_504,
        parent=fp16,
        quantization=awq,
    )
    small = ModelVersion.objects.create(
        model=smol,
        revision="q8_0",
        source_kind="gguf",
        source_path="/srv/models/smollm2-135m-instruct-q8_0.gguf",
        parameter_count=134_515_008,
        max_context=8192,
        state="failed",
        file_count=1,
        total_bytes=144_811_968,
        quantization=q8,
    )
    for name in ("llama-3.1-8b", "llama-3.1-8b-instruct-long-context", "default-chat"):
        ModelAlias.objects.create(name=name, active_version=fp16)
    ModelAlias.objects.create(name="smollm2-135m", active_version=small)


def test_versions_table_has_no_horizontal_overflow_at_1440px(browser_page: Any, admin_user: User) -> None:
    _versions()
    page = browser_page
    page.set_viewport_size({"width": 1440, "height": 900})
    login(page, admin_user.username, PASSWORD)
    page.goto("/models")
    table = page.get_by_test_id("versions-table")
    expect(table.locator("tbody tr")).to_have_count(3)
    expect(table).to_contain_text("llama-3.1-8b-instruct-long-context")
    screenshot(page, "models-table-1440")
    scroll_width, client_width = table.evaluate("el => [el.scrollWidth, el.clientWidth]")
    assert scroll_width <= client_width, (
        f"the versions table overflows its box: {scroll_width} > {client_width}"
    )
    # Nor does the page itself scroll sideways.
    page_widths = page.evaluate(
        "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert page_widths[0] <= page_widths[1], page_widths
    # Every column is still there, the last one (Registered) included.
    assert table.locator("thead th").last.inner_text().strip().lower() == "registered"
    expect(table.locator("tbody tr").first.locator("td").last).to_be_visible()
