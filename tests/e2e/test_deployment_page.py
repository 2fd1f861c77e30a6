"""The deployment page after a crash and a restart: the lifetime restart count beside the current streak,
Start disabled while the engine runs, and charts with the last hour of samples, a time window, units and a
tooltip."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from console.models import User
from models_registry.models import Model, ModelVersion
from nodes.agent import runtime
from nodes.agent.gpus import GpuSource, simulated_gpu_config
from nodes.agent.services import report_gpus
from nodes.choices import DeploymentState, Engine, HostState
from nodes.lifecycle import transition
from nodes.models import Deployment, Host
from tests.conftest import PASSWORD
from tests.e2e.harness import login, screenshot
from tests.e2e.telemetry import HOUR, in_thread, seed_hour

pytestmark = pytest.mark.e2e


def make_deployment() -> Deployment:
    host = Host.objects.create(
        name="page-a", address="127.0.0.1", state=HostState.ONLINE, last_heartbeat=timezone.now()
    )
    report_gpus(host, GpuSource(host.name, simulated_gpu_config("h100-llama3-8b-fp16", 1)).inventory())
    version = ModelVersion.objects.create(
        model=Model.objects.create(name="Llama-3.1-8B-Instruct"),
        revision="fp16",
        source_kind="directory",
        source_path="/srv/models/llama",
        state="verified",
    )
    return Deployment.objects.create(
        name="page-engine",
        model_version=version,
        engine=Engine.SIM,
        host=host,
        gpu_indices=[0],
        port=18999,
        served_model_name="llama-3.1-8b",
        state=DeploymentState.READY,
    )


def test_restarts_start_button_and_hour_charts(
    browser_page: Any, admin_user: User, settings: Any, tmp_path: Path, redis_clean: None
) -> None:
    settings.ENGINE_LOG_DIR = tmp_path / "engines"
    deployment = make_deployment()

    def crash_then_recover() -> None:
        runtime.record_crash(deployment, "The engine exited with code 1.")
        # The relaunch (runtime.launch clears the pending restart), then ready.
        transition(deployment, DeploymentState.STARTING, "Engine started again.", next_restart_at=None)
        transition(deployment, DeploymentState.READY, "Ready again.")
        # The supervisor's reset after a stable run: the streak ends, the lifetime count stays.
        Deployment.objects.filter(pk=deployment.pk).update(restart_count=0)

    in_thread(crash_then_recover)
    points = seed_hour("page-a", 0, deployment.pk)

    page = browser_page
    login(page, admin_user.username, PASSWORD)
    page.goto(f"/nodes/deployments/{deployment.pk}")
    expect(page.get_by_test_id("deployment-state")).to_have_attribute("data-state", "ready")

    # After one crash and a restart that stayed up: one restart in all, none in a row.
    expect(page.get_by_test_id("restarts-total")).to_have_text("1")
    expect(page.get_by_test_id("restart-streak")).to_have_text("0")
    expect(page.get_by_test_id("deployment-restarts")).to_contain_text("restarts 1 in all")

    # Running: Start is disabled; the actions that apply to a running engine are not.
    expect(page.get_by_test_id("action-start")).to_be_disabled()
    expect(page.get_by_test_id("action-stop")).to_be_enabled()
    expect(page.get_by_test_id("action-restart")).to_be_enabled()

    # The charts start from the stored hour, on a time axis that spans it.
    chart = page.get_by_test_id("deployment-tps-chart")
    expect(chart).to_have_attribute("data-points", str(points))
    expect(chart).to_have_attribute("aria-label", "Throughput (tokens/s), last hour")
    x_min = float(chart.get_attribute("data-x-min") or "nan")
    x_max = float(chart.get_attribute("data-x-max") or "nan")
    assert x_max - x_min >= HOUR, (x_min, x_max)
    assert abs(x_max - time.time()) < 120, x_max
    for test_id in ("deployment-requests-chart", "deployment-kv-chart", "deployment-latency-chart"):
        expect(page.get_by_test_id(test_id)).to_have_attribute("data-points", str(points))
    expect(page.get_by_test_id("deployment-gpu-0-chart")).to_have_attribute("data-points", str(points))

    # Hovering shows the values under the pointer, with units.
    page.get_by_test_id("deployment-tps-chart").locator(".u-over").hover()
    tooltip = page.get_by_test_id("deployment-tps-chart-tooltip")
    expect(tooltip).to_be_visible()
    expect(tooltip).to_contain_text("generated:")
    expect(tooltip).to_contain_text("tok/s")
    page.get_by_test_id("deployment-latency-chart").locator(".u-over").hover()
    expect(page.get_by_test_id("deployment-latency-chart-tooltip")).to_contain_text("80 ms")
    screenshot(page, "deployment-page-charts")

    # Stopped: Start is offered again.
    in_thread(lambda: transition(deployment, DeploymentState.STOPPED, "Stopped."))
    page.reload()
    expect(page.get_by_test_id("deployment-state")).to_have_attribute("data-state", "stopped")
    expect(page.get_by_test_id("action-start")).to_be_enabled()
