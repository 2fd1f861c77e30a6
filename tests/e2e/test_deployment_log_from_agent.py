"""In the browser, the deployment page of an engine run by a fleet agent (its own process, no database
settings) shows the log tail from that agent and downloads the log file through it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from console.models import User
from nodes.agent.gpus import GpuSource, simulated_gpu_config
from nodes.agent.services import report_gpus
from nodes.agent_tokens import issue_agent_token
from nodes.choices import DeploymentState, Engine, HostState
from nodes.models import Deployment, Host
from tests.conftest import PASSWORD
from tests.e2e.harness import LiveConsole, login, require_frontend_build, screenshot, start_console
from tests.nodes.agent_channel import kill, start_agent, stop_engines_under, wait_for
from tests.nodes.conftest import free_port, register_llama

pytestmark = pytest.mark.e2e


@pytest.fixture
def live_console(transactional_db: None, tmp_path: Path) -> Iterator[LiveConsole]:
    """The console, with the test's model root (it checks the version's files before a launch)."""
    require_frontend_build()
    (tmp_path / "models").mkdir()
    console = start_console(tmp_path, {"MODEL_ROOTS": str(tmp_path / "models")})
    yield console
    console.stop()


def test_log_tail_and_download_come_from_the_hosts_agent(
    live_console: LiveConsole, browser_page: Any, admin_user: User, tmp_path: Path, settings: Any
) -> None:
    settings.MODEL_ROOTS = [tmp_path / "models"]
    host = Host.objects.create(
        name="far-a", address="127.0.0.1", state=HostState.ONLINE, last_heartbeat=timezone.now()
    )
    report_gpus(host, GpuSource(host.name, simulated_gpu_config("h100-llama3-8b-fp16", 1)).inventory())
    token = issue_agent_token(host).raw_token
    version = register_llama(tmp_path / "models", host.name)
    deployment = Deployment.objects.create(
        name="far-engine",
        model_version=version,
        engine=Engine.SIM,
        host=host,
        gpu_indices=[0],
        gpu_memory_utilization=0.45,
        max_num_seqs=16,
        port=free_port(),
        served_model_name="llama-3.1-8b",
        extra_args=["--sim-time-scale", "50"],
    )
    log = tmp_path / "agent.log"
    agent = start_agent(host.name, live_console.url, token, tmp_path / "engines" / host.name, log)
    try:
        wait_for(
            lambda: Deployment.objects.get(pk=deployment.pk).state == DeploymentState.READY, 60, "ready", log
        )
        page = browser_page
        login(page, admin_user.username, PASSWORD)
        page.goto(f"/nodes/deployments/{deployment.pk}")
        expect(page.get_by_text("Log tail (from the host's agent)")).to_be_visible()
        tail = page.get_by_test_id("log-tail")
        expect(tail).not_to_have_text("No log yet.")
        shown = tail.inner_text().splitlines()[-1]
        screenshot(page, "log-tail-from-agent")
        with page.expect_download() as download_info:
            page.get_by_test_id("log-download").click()
        download = download_info.value
        assert download.suggested_filename == "far-engine.log"
        assert shown in Path(download.path()).read_text()
    finally:
        kill(agent)
        stop_engines_under(tmp_path / "engines")
