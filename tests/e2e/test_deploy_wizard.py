"""The deploy wizard shows the fit check before launch: a refused combination says why and cannot be
deployed; a good one is created and opens its deployment page."""

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
from nodes.models import Deployment, Host
from tests.conftest import PASSWORD
from tests.e2e.harness import login, screenshot

pytestmark = [pytest.mark.e2e]


@pytest.fixture(autouse=True)
def hosts_stay_reachable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The console process reads it at start: the seeded hosts have no agent sending heartbeats, and a
    slow run must not see them fall unreachable after the default 6 s (no proposal goes to such a host)."""
    monkeypatch.setenv("NODE_UNREACHABLE_SECONDS", "3600")


def test_wizard_refuses_then_deploys(
    browser_page: Any, admin_user: Any, settings: Any, tmp_path: Path
) -> None:
    settings.MODEL_ROOTS = [tmp_path / "models"]
    host = Host.objects.create(name="wiz-a", state=HostState.ONLINE, last_heartbeat=timezone.now())
    report_gpus(host, GpuSource(host.name, simulated_gpu_config("h100-llama3-8b-fp16", 1)).inventory())
    version = register_version(
        model=Model.objects.create(name="Llama-3.1-8B-Instruct"),
        revision="fp16",
        source_path=str(write_config_dir(tmp_path / "models" / "llama", LLAMA_31_8B_CONFIG)),
        host_name=host.name,
    )
    ModelAlias.objects.create(name="llama-3.1-8b", active_version=version)

    page = browser_page
    login(page, admin_user.username, PASSWORD)
    page.goto("/nodes")
    expect(page.get_by_test_id("host-wiz-a")).to_be_visible()
    page.get_by_test_id("deploy-button").click()
    wizard = page.get_by_test_id("deploy-wizard")
    wizard.get_by_label("Name", exact=True).fill("wizard-long")
    wizard.get_by_label("Serves as (alias)").select_option("llama-3.1-8b")
    wizard.get_by_label("Model version").select_option(str(version.pk))
    wizard.get_by_label("Engine", exact=True).select_option("sim")
    wizard.get_by_label("Host", exact=True).select_option(str(host.pk))
    # GPUs are picked by clicking their cards (issue 35 item 7), no longer typed as indices.
    wizard.get_by_test_id("gpu-card-0").get_by_role("checkbox").check()
    wizard.get_by_label("Max model length").fill("200000")

    wizard.get_by_test_id("run-fit-check").click()
    result = wizard.get_by_test_id("fit-result")
    expect(result).to_have_attribute("data-ok", "false")
    expect(result).to_contain_text("exceeds the model's maximum context of 131,072 tokens")
    expect(wizard.get_by_test_id("deploy-submit")).to_be_disabled()
    screenshot(page, "deploy_wizard_refused", full_page=False)

    wizard.get_by_label("Max model length").fill("32768")
    # Issue 20 item 4: extra_args vLLM would refuse are refused here, with vLLM's reason.
    wizard.get_by_label("Extra engine args").fill("--disable-log-stats --enable-per-request-metrics")
    wizard.get_by_test_id("run-fit-check").click()
    expect(result).to_have_attribute("data-ok", "false")
    expect(result).to_contain_text("cli_args.py:429-435")
    wizard.get_by_label("Extra engine args").fill("")
    expect(result).to_be_hidden()  # an edit drops the old check
    wizard.get_by_test_id("run-fit-check").click()
    expect(result).to_have_attribute("data-ok", "true", timeout=15_000)
    expect(result).to_contain_text("KV cache tokens")
    # Item 3: left empty, the engine values are vLLM's, computed for this (simulated H100 80GB) GPU.
    expect(wizard.get_by_test_id("vllm-defaults")).to_contain_text("max_num_seqs 1024")
    expect(wizard.get_by_test_id("vllm-defaults")).to_contain_text("gpu_memory_utilization 0.92")
    expect(wizard).to_contain_text("it will use 8192")
    wizard.get_by_test_id("deploy-submit").click()

    expect(page).to_have_url(re.compile(r"/nodes/deployments/\d+$"))
    expect(page.get_by_test_id("deployment-state")).to_be_visible()
    created = Deployment.objects.get(name="wizard-long")
    assert page.url.endswith(f"/nodes/deployments/{created.pk}")
    assert (created.max_model_len, created.served_model_name, created.gpu_indices) == (
        32768,
        "llama-3.1-8b",
        [0],
    )
    assert (created.gpu_memory_utilization, created.max_num_seqs, created.block_size) == (None, None, None)
    expect(page.get_by_test_id("quantization-kernel")).to_contain_text("only vLLM logs its kernel")
