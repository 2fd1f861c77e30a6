"""The dashboard updates live: GPU and engine samples from a real agent loop reach the browser through
the WebSocket and redraw the charts without a reload; the page measures sample -> browser delay."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from nodes import process
from nodes.agent import runtime
from nodes.agent.gpus import GpuSource, simulated_gpu_config
from nodes.agent.services import report_gpus
from nodes.agent.supervisor import Supervisor
from nodes.choices import Engine, HostState
from nodes.demo import LLAMA_31_8B_CONFIG, write_config_dir
from nodes.models import Deployment, Host
from tests.conftest import PASSWORD
from tests.e2e.harness import SCREENSHOT_DIR, free_port, login, screenshot

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def run_supervisor(supervisor: Supervisor) -> None:
    try:
        supervisor.run()
    finally:
        connection.close()


def test_dashboard_charts_update_without_reload(
    browser_page: Any, admin_user: Any, settings: Any, tmp_path: Path
) -> None:
    from models_registry.models import Model
    from models_registry.services import register_version

    settings.ENGINE_LOG_DIR = tmp_path / "engines"
    settings.MODEL_ROOTS = [tmp_path / "models"]
    settings.NODE_TELEMETRY_SECONDS = 0.5
    host = Host.objects.create(name="dash-a", state=HostState.ONLINE, last_heartbeat=timezone.now())
    gpus = GpuSource(host.name, simulated_gpu_config("h100-llama3-8b-fp16", 1))
    report_gpus(host, gpus.inventory())
    version = register_version(
        model=Model.objects.create(name="Llama-3.1-8B-Instruct"),
        revision="fp16",
        source_path=str(write_config_dir(tmp_path / "models" / "llama", LLAMA_31_8B_CONFIG)),
        host_name=host.name,
    )
    deployment = Deployment.objects.create(
        name="dash-engine",
        model_version=version,
        engine=Engine.SIM,
        host=host,
        gpu_indices=[0],
        gpu_memory_utilization=0.9,
        max_model_len=8192,
        max_num_seqs=32,
        port=free_port(),
        served_model_name="llama-3.1-8b",
        role="long-context",
        extra_args=["--sim-time-scale", "5"],
    )
    supervisor = Supervisor(host.name, gpus)
    # Off the main thread: Playwright's event loop runs there, and live pushes need a loop-free thread.
    outcome: list[str] = []

    def start() -> None:
        supervisor.start()
        outcome.append(runtime.launch(deployment.pk))
        connection.close()

    starter = threading.Thread(target=start)
    starter.start()
    starter.join(30)
    assert outcome == ["started"]
    loop = threading.Thread(target=run_supervisor, args=(supervisor,), daemon=True)
    loop.start()
    try:
        page = browser_page
        login(page, admin_user.username, PASSWORD)
        page.goto("/")
        chart = page.get_by_test_id("gpu-util-dash-a:0")
        points = "Number(document.querySelector('[data-testid=\"gpu-util-dash-a:0\"]').dataset.points)"
        chart.wait_for()
        # Same page, no reload: the chart gains points as samples arrive.
        page.wait_for_function(f"() => {points} >= 3")
        first = int(chart.get_attribute("data-points") or 0)
        page.wait_for_function(f"() => {points} > {first}")
        assert page.get_by_test_id("simulated-notice").is_visible()
        gpu_tile = page.get_by_test_id("gpu-dash-a:0")
        assert "simulated" in gpu_tile.inner_text().lower()
        assert "GiB" in gpu_tile.inner_text()
        # The engine row turns ready and shows live numbers.
        page.wait_for_function(
            "() => document.querySelector('[data-testid=\"engines-table\"]')"
            ".innerText.toLowerCase().includes('ready')",
            timeout=30_000,
        )
        # Sample -> browser latency, measured by the page over the last events.
        time.sleep(3)
        latency = page.get_by_test_id("feed-latency")
        latency_ms = float(latency.get_attribute("data-ms") or "nan")
        samples = page.evaluate(
            "() => document.querySelector('[data-testid=\"gpu-util-dash-a:0\"]').dataset.points"
        )
        assert 0 <= latency_ms < 2000, latency_ms
        SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
        (SCREENSHOT_DIR / "dashboard_latency.json").write_text(
            json.dumps({"median_sample_to_browser_ms": latency_ms, "chart_points": int(samples)})
        )
        print(f"median GPU sample -> browser latency: {latency_ms:.1f} ms")
        screenshot(page, "dashboard_live")
    finally:
        supervisor.close()
        loop.join(5)
        # The engine runs in its own session: stop it explicitly, whatever the test's outcome.
        record = process.read_record(settings.ENGINE_LOG_DIR / host.name, deployment.pk)
        if record is not None:
            process.stop_engine(record.pid, timeout=5)
