"""Sleep and wake in the console: an admin sleeps a ready engine from its page, sees it asleep with its
freed memory (deployment and nodes pages), wakes it, and sets a pool's scale to zero in the routing page."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from console.models import User
from core.redis_client import get_redis
from nodes.choices import DeploymentState
from nodes.lifecycle import transition, wake_request_key
from nodes.models import Deployment
from routing.models import RoutePool
from tests.conftest import PASSWORD
from tests.e2e.harness import login, screenshot
from tests.e2e.telemetry import in_thread
from tests.e2e.test_deployment_page import make_deployment

pytestmark = pytest.mark.e2e


def test_sleep_wake_and_scale_to_zero(browser_page: Any, admin_user: User, redis_clean: None) -> None:
    deployment = make_deployment()
    Deployment.objects.filter(pk=deployment.pk).update(
        sleep_enabled=True, gpu_memory_utilization=0.9, launch_argv=["vllm", "serve", "--enable-sleep-mode"]
    )
    page = browser_page
    login(page, admin_user.username, PASSWORD)
    page.goto(f"/nodes/deployments/{deployment.pk}")
    expect(page.get_by_test_id("deployment-state")).to_have_attribute("data-state", "ready")
    expect(page.get_by_test_id("action-wake")).to_be_disabled()

    page.get_by_test_id("action-sleep").click()
    page.locator("dialog").get_by_role("button", name="sleep", exact=True).click()
    expect(page.locator("dialog")).to_have_count(0)
    # The agent confirms the sleep (here: what its runtime.sleep records).
    in_thread(
        lambda: transition(deployment, DeploymentState.SLEEPING, "Asleep at level 1.", sleeping_level=1)
    )
    expect(page.get_by_test_id("deployment-state")).to_have_attribute("data-state", "sleeping")
    info = page.get_by_test_id("sleep-info")
    expect(info).to_contain_text("level 1")
    # 0.9 of an H100's 79.6 GiB held awake; asleep only the CUDA context (1 GiB) stays.
    expect(page.get_by_test_id("freed-memory")).to_have_text("70.7 GiB")
    expect(page.get_by_test_id("action-sleep")).to_be_disabled()
    screenshot(page, "deployment-sleeping")

    page.get_by_role("link", name="← Nodes").click()
    expect(page.get_by_test_id(f"freed-{deployment.pk}")).to_contain_text("level 1 · 70.7 GiB freed")
    page.go_back()

    page.get_by_test_id("action-wake").click()
    page.locator("dialog").get_by_role("button", name="wake", exact=True).click()
    expect(page.locator("dialog")).to_have_count(0)
    assert get_redis().get(wake_request_key(deployment.pk)) is not None  # the agent's cue
    in_thread(lambda: transition(deployment, DeploymentState.READY, "Awake after 0.4 s.", sleeping_level=0))
    expect(page.get_by_test_id("deployment-state")).to_have_attribute("data-state", "ready")
    expect(page.get_by_test_id("sleep-info")).to_have_count(0)

    RoutePool.objects.create(name="llama", alias="llama-3.1-8b")
    page.get_by_role("link", name="Routing").click()
    expect(page.get_by_test_id("pools-table")).to_contain_text("llama")
    expect(page.get_by_test_id("pool-sleep-llama")).to_have_count(0)  # no idle sleep
    page.get_by_test_id("pools-table").locator("tbody tr", has_text="llama").click()
    dialog = page.get_by_test_id("pool-dialog")
    dialog.get_by_label("Scale to zero").check()
    dialog.get_by_role("button", name="Save").click()
    # Scale to zero without an idle time is refused next to the field.
    expect(dialog).to_contain_text("Scale to zero needs sleep_idle_seconds")
    dialog.get_by_label("Sleep after idle (s)").fill("300")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog).to_be_hidden()
    expect(page.get_by_test_id("pool-sleep-llama")).to_have_text("to zero · 300 s · L1")
    pool = RoutePool.objects.get(name="llama")
    assert pool.scale_to_zero and pool.sleep_idle_seconds == 300
    screenshot(page, "routing-pool-scale-to-zero")
