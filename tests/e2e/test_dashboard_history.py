"""The dashboard's charts open on the last hour of stored samples: a time axis that spans the hour, units,
and a tooltip with the values under the pointer; the page does not scroll sideways."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from console.models import User
from models_registry.models import Model, ModelVersion
from nodes.agent.gpus import GpuSource, simulated_gpu_config
from nodes.agent.services import report_gpus
from nodes.choices import DeploymentState, Engine, HostState
from nodes.models import Deployment, Host
from tests.conftest import PASSWORD
from tests.e2e.harness import login, screenshot
from tests.e2e.telemetry import HOUR, seed_hour

pytestmark = pytest.mark.e2e


def test_dashboard_charts_show_the_last_hour(browser_page: Any, admin_user: User, redis_clean: None) -> None:
    host = Host.objects.create(
        name="hist-a", address="127.0.0.1", state=HostState.ONLINE, last_heartbeat=timezone.now()
    )
    report_gpus(host, GpuSource(host.name, simulated_gpu_config("h100-llama3-8b-fp16", 1)).inventory())
    version = ModelVersion.objects.create(
        model=Model.objects.create(name="Llama-3.1-8B-Instruct"),
        revision="fp16",
        source_kind="directory",
        source_path="/srv/models/llama",
    )
    deployment = Deployment.objects.create(
        name="hist-engine",
        model_version=version,
        engine=Engine.SIM,
        host=host,
        gpu_indices=[0],
        port=18998,
        served_model_name="llama-3.1-8b",
        state=DeploymentState.READY,
    )
    points = seed_hour(host.name, 0, deployment.pk)

    page = browser_page
    login(page, admin_user.username, PASSWORD)
    page.goto("/")
    util = page.get_by_test_id("gpu-util-hist-a:0")
    expect(util).to_have_attribute("data-points", str(points))
    expect(util).to_have_attribute("aria-label", "GPU utilization (%), last hour")
    x_min = float(util.get_attribute("data-x-min") or "nan")
    x_max = float(util.get_attribute("data-x-max") or "nan")
    assert x_max - x_min >= HOUR and abs(x_max - time.time()) < 120, (x_min, x_max)
    expect(page.get_by_test_id("gpu-mem-hist-a:0")).to_have_attribute("data-points", str(points))
    engine_chart = page.get_by_test_id(f"engine-tps-{deployment.pk}")
    expect(engine_chart).to_have_attribute("data-points", str(points))

    util.locator(".u-over").hover()
    expect(page.get_by_test_id("gpu-util-hist-a:0-tooltip")).to_contain_text("utilization: 55%")
    page.get_by_test_id("gpu-mem-hist-a:0").locator(".u-over").hover()
    expect(page.get_by_test_id("gpu-mem-hist-a:0-tooltip")).to_contain_text("70 GiB")
    engine_chart.locator(".u-over").hover()
    expect(page.get_by_test_id(f"engine-tps-{deployment.pk}-tooltip")).to_contain_text("tok/s")
    screenshot(page, "dashboard-history")

    widths = page.evaluate(
        "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert widths[0] <= widths[1], widths
