"""The deploy wizard places a model too big for one host across two (one pipeline stage per host), with
Ray or with vLLM's multiprocessing executor, and the deployment page lists its hosts by stage and how
they run together."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from models_registry.models import Model, ModelAlias
from models_registry.services import register_version
from nodes.agent.gpus import GpuSource, simulated_gpu_config
from nodes.agent.services import report_gpus
from nodes.choices import HostState
from nodes.demo import LLAMA_31_8B_CONFIG, write_config_dir
from nodes.models import Deployment, Gpu, Host
from tests.conftest import PASSWORD
from tests.e2e.harness import login, screenshot

pytestmark = [pytest.mark.e2e]


@pytest.fixture(autouse=True)
def hosts_stay_reachable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The console process reads it at start: the seeded hosts have no agent sending heartbeats, and a
    slow run must not see them fall unreachable after the default 6 s."""
    monkeypatch.setenv("NODE_UNREACHABLE_SECONDS", "3600")


def test_wizard_places_a_model_across_two_hosts(
    browser_page: Any, admin_user: Any, settings: Any, tmp_path: Path
) -> None:
    settings.MODEL_ROOTS = [tmp_path / "models"]
    hosts = []
    for name in ("span-a", "span-b"):
        host = Host.objects.create(name=name, state=HostState.ONLINE, last_heartbeat=timezone.now())
        report_gpus(host, GpuSource(name, simulated_gpu_config("h100-llama3-8b-fp16", 1)).inventory())
        hosts.append(host)
    # 16 GiB GPUs: Llama 3.1 8B in fp16 fits on neither alone, and on both in two stages.
    Gpu.objects.update(memory_total_bytes=16 * 1024**3)
    version = register_version(
        model=Model.objects.create(name="Llama-3.1-8B-Instruct"),
        revision="fp16",
        source_path=str(write_config_dir(tmp_path / "models" / "llama", LLAMA_31_8B_CONFIG)),
        host_name="span-a",
    )
    ModelAlias.objects.create(name="llama-3.1-8b", active_version=version)

    page = browser_page
    login(page, admin_user.username, PASSWORD)
    page.goto("/nodes")
    page.get_by_test_id("deploy-button").click()
    wizard = page.get_by_test_id("deploy-wizard")
    wizard.get_by_label("Name", exact=True).fill("llama-two-hosts")
    wizard.get_by_label("Serves as (alias)").select_option("llama-3.1-8b")
    wizard.get_by_label("Model version").select_option(str(version.pk))
    wizard.get_by_label("Engine", exact=True).select_option("sim")
    wizard.get_by_label("Host", exact=True).select_option(str(hosts[0].pk))
    wizard.get_by_test_id("gpu-card-0").get_by_role("checkbox").check()  # GPUs are picked by clicking
    wizard.get_by_label("Max model length").fill("4096")
    wizard.get_by_test_id("run-fit-check").click()
    result = wizard.get_by_test_id("fit-result")
    expect(result).to_have_attribute("data-ok", "false")
    expect(result).to_contain_text("do not fit")

    backend = wizard.get_by_label("Across hosts, run with")
    expect(backend).to_have_count(0)  # asked only once the deployment spans hosts
    wizard.get_by_label("Further hosts (pipeline stages)").fill("span-b:0")
    expect(backend).to_have_value("ray")
    backend.select_option("mp")
    wizard.get_by_label("Master port").fill("29610")
    wizard.get_by_test_id("run-fit-check").click()
    expect(result).to_have_attribute("data-ok", "true", timeout=15_000)
    expect(result).to_contain_text("1/2 of the layers")
    wizard.get_by_test_id("deploy-submit").click()

    expect(page).to_have_url(re.compile(r"/nodes/deployments/\d+$"))
    hosts_line = page.get_by_test_id("deployment-hosts")
    expect(hosts_line).to_contain_text("vLLM multiprocessing, no Ray")
    expect(hosts_line).to_contain_text("span-a (stage 0, API server, master port 29610, GPUs 0)")
    expect(hosts_line).to_contain_text("span-b (stage 1, GPUs 0)")
    screenshot(page, "deployment_across_hosts", full_page=False)
    created = Deployment.objects.get(name="llama-two-hosts")
    assert created.pipeline_parallel_size == 2
    assert (created.multi_host_backend, created.master_port) == ("mp", 29610)
    assert [(m.host.name, m.stage, m.gpu_indices) for m in created.members.all()] == [("span-b", 1, [0])]

    # The same on Ray: the page says so.
    Deployment.objects.filter(pk=created.pk).update(multi_host_backend="ray")
    page.reload()
    expect(hosts_line).to_contain_text("over Ray")
    expect(hosts_line).to_contain_text("span-a (stage 0, Ray head, GPUs 0)")
