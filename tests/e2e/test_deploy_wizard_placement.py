"""Placement help in the deploy wizard (issue 35 item 7): each GPU's card shows its free memory, the
proposed placement is one click, the verdict sits at the top with its whole arithmetic (tokens shown as
tokens, nothing clipped), and a choice that does not fit lists what would, each applicable; a llama.cpp
engine shows none of vLLM's settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from models_registry.models import Model, ModelAlias, QuantizationConfig
from models_registry.services import register_version
from nodes.agent.gpus import GpuSource, simulated_gpu_config
from nodes.agent.services import report_gpus
from nodes.choices import DeploymentState, Engine, HostState
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


VLLM_ONLY_LABELS = (
    "Quantization",
    "GPU memory utilization",
    "Block size",
    "Max sequences",
    "Pipeline parallel size",
    "Further hosts (pipeline stages)",
    "Force --quantization",
    "Prefix caching",
)

# Every cell of a table fits inside it and the table inside the dialog: nothing clipped or scrolled.
UNCLIPPED = """table => {
  const body = table.closest('.dialog-body');
  const cells = [...table.querySelectorAll('td, th')];
  return table.getBoundingClientRect().right <= body.getBoundingClientRect().right + 1
    && cells.every(c => c.scrollWidth <= c.clientWidth + 1);
}"""


def _host(name: str, profile: str, gpus: int) -> Host:
    host = Host.objects.create(name=name, state=HostState.ONLINE, last_heartbeat=timezone.now())
    report_gpus(host, GpuSource(host.name, simulated_gpu_config(profile, gpus)).inventory())
    return host


def test_placement_help_proposes_explains_and_says_what_would_fit(
    browser_page: Any, admin_user: Any, settings: Any, tmp_path: Path
) -> None:
    settings.MODEL_ROOTS = [tmp_path / "models"]
    big = _host("gpu-big", "h100-llama3-8b-fp16", 2)
    small = _host("gpu-small", "a10-llama3-8b-int4", 1)
    model = Model.objects.create(name="Llama-3.1-8B-Instruct")
    fp16 = register_version(
        model=model,
        revision="fp16",
        source_path=str(write_config_dir(tmp_path / "models" / "llama-fp16", LLAMA_31_8B_CONFIG)),
        host_name=big.name,
    )
    awq = register_version(
        model=model,
        revision="awq",
        source_path=str(write_config_dir(tmp_path / "models" / "llama-awq", LLAMA_31_8B_CONFIG)),
        quantization=QuantizationConfig.objects.create(name="awq-int4", method="awq", bits=4, group_size=128),
        parent=fp16,
        host_name=big.name,
    )
    ModelAlias.objects.create(name="llama-3.1-8b", active_version=fp16)
    Deployment.objects.create(
        name="holder",
        model_version=fp16,
        engine=Engine.SIM,
        host=big,
        gpu_indices=[0],
        gpu_memory_utilization=0.9,
        max_model_len=4096,
        port=18770,
        served_model_name="llama-3.1-8b",
        state=DeploymentState.READY,
    )

    page = browser_page
    login(page, admin_user.username, PASSWORD)
    page.goto("/nodes")
    expect(page.get_by_test_id("host-gpu-big")).to_be_visible()
    page.get_by_test_id("deploy-button").click()
    wizard = page.get_by_test_id("deploy-wizard")
    wizard.get_by_label("Name", exact=True).fill("placed")
    wizard.get_by_label("Model version").select_option(str(fp16.pk))
    wizard.get_by_label("Engine", exact=True).select_option("sim")
    wizard.get_by_label("Host", exact=True).select_option(str(big.pk))

    # Free memory per GPU, as the fit check counts it: the holder reserves 90 % of GPU 0's 79.6 GiB.
    expect(wizard.get_by_test_id("gpu-free-0")).to_have_text("7.96 GiB free")
    expect(wizard.get_by_test_id("gpu-card-0")).to_contain_text("held by holder (90 %)")
    expect(wizard.get_by_test_id("gpu-free-1")).to_have_text("79.6 GiB free")

    # The proposal takes the free GPU; one click applies it and the verdict at the top says it fits.
    use = wizard.get_by_test_id("use-proposed-placement")
    expect(use).to_contain_text("gpu-big GPU 1")
    use.click()
    expect(wizard.get_by_test_id("gpu-card-1").get_by_role("checkbox")).to_be_checked()
    expect(wizard.get_by_test_id("gpu-card-0").get_by_role("checkbox")).not_to_be_checked()
    expect(use).to_be_hidden()
    verdict = wizard.get_by_test_id("placement-verdict")
    expect(verdict).to_have_attribute("data-fits", "true")
    expect(wizard.get_by_test_id("placement-verdict-title")).to_have_text("Fits on gpu-big GPU 1")
    arithmetic = wizard.get_by_test_id("placement-arithmetic")
    for label in ("weights", "KV cache of one full-length sequence", "runtime overhead", "needed per GPU"):
        expect(arithmetic).to_contain_text(label)
    expect(arithmetic.locator("tr", has_text="context (max_model_len)")).to_contain_text("8,192 tokens")
    # Token counts are counts: the largest context reads in tokens, never "0 B" or any bytes.
    largest = wizard.get_by_test_id("placement-fit-steps").locator("tr", has_text="largest context that fits")
    expect(largest.locator("td.num")).to_have_text("131,072 tokens")
    assert verdict.bounding_box()["y"] < wizard.get_by_label("Port").bounding_box()["y"]  # at the top
    for table in ("placement-arithmetic", "placement-gpus", "placement-fit-steps"):
        assert wizard.get_by_test_id(table).evaluate(UNCLIPPED), f"{table} is clipped"
    screenshot(page, "deploy_wizard_placement_fits", full_page=False)

    # A choice that does not fit: the A10 host at a 65,536-token context. What would fit is listed.
    wizard.get_by_label("Host", exact=True).select_option(str(small.pk))
    wizard.get_by_test_id("gpu-card-0").get_by_role("checkbox").check()
    wizard.get_by_label("Max model length").fill("65536")
    expect(verdict).to_have_attribute("data-fits", "false")
    expect(wizard.get_by_test_id("placement-verdict-title")).to_have_text("Does not fit on gpu-small GPU 0")
    expect(wizard.get_by_test_id("alternative-context")).to_contain_text("Set the context (max_model_len) to")
    expect(wizard.get_by_test_id("alternative-version")).to_contain_text("Llama-3.1-8B-Instruct@awq")
    expect(wizard.get_by_test_id("alternative-host")).to_contain_text("Deploy on gpu-big (GPU 1)")
    wizard.get_by_test_id("placement-help").evaluate("e => e.scrollIntoView()")
    screenshot(page, "deploy_wizard_placement_alternatives", full_page=False)

    wizard.get_by_test_id("apply-alternative-version").click()
    expect(wizard.get_by_label("Model version")).to_have_value(str(awq.pk))
    expect(verdict).to_have_attribute("data-fits", "true")
    expect(wizard.get_by_test_id("placement-verdict-title")).to_have_text("Fits on gpu-small GPU 0")
    # The placement help and the checks create runs agree.
    wizard.get_by_test_id("run-fit-check").click()
    expect(wizard.get_by_test_id("fit-result")).to_have_attribute("data-ok", "true")

    # llama.cpp: none of vLLM's settings, no GPUs to pick, and n_ctx in llama.cpp's terms.
    wizard.get_by_label("Engine", exact=True).select_option("llamacpp")
    expect(wizard.get_by_label("Context size (n_ctx)")).to_be_visible()
    expect(wizard.get_by_label("Batch size (n_batch)")).to_be_visible()
    for label in VLLM_ONLY_LABELS:
        expect(wizard.get_by_label(label, exact=True)).to_have_count(0)
    expect(wizard.get_by_test_id("gpu-picker")).to_have_count(0)
    expect(wizard.get_by_test_id("placement-note")).to_contain_text("llama.cpp runs on the host's CPU")
