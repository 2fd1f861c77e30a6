"""Each engine kind shown as it is: a llama.cpp deployment with llama-cpp-python's version, llama.cpp's own
settings and "not reported" for the metrics it does not serve, beside a vLLM one with vLLM's; and the
health-probe lines of either engine's log tail folded into one line with a count, which opens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from console.models import User
from core.redis_client import get_redis
from models_registry.models import Model, ModelVersion
from nodes.agent.gpus import GpuSource, simulated_gpu_config
from nodes.agent.services import launch_record, report_gpus
from nodes.choices import DeploymentState, Engine, HostState
from nodes.engines import EngineSpec, llamacpp, vllm
from nodes.lifecycle import live_deployment_key
from nodes.models import Deployment, DeploymentEvent, Host
from tests.conftest import PASSWORD
from tests.e2e.harness import login, screenshot

pytestmark = pytest.mark.e2e

VLLM_ONLY = ("GPUs ", "gpu_memory_utilization ", "tp ", "pp ", "block_size ", "max_num_seqs ", "prefix ")
GGUF = "/srv/models/smollm2/SmolLM2-135M-Instruct-Q8_0.gguf"


def probe_lines(paths: tuple[str, ...], rounds: int) -> list[str]:
    """uvicorn's access lines for the agent's probes, as vLLM and llama-cpp-python both write them."""
    line = 'INFO:     127.0.0.1:{} - "GET {} HTTP/1.1" 200 OK'
    return [line.format(40000 + i, p) for i in range(rounds) for p in paths]


def deploy(
    host: Host, engine: str, name: str, port: int, argv_of: Any, log: Path, lines: list[str], **fields: Any
) -> Deployment:
    version = ModelVersion.objects.create(
        model=Model.objects.create(name=f"model-{name}"),
        revision="main",
        source_kind="gguf" if engine == Engine.LLAMACPP else "directory",
        source_path=GGUF if engine == Engine.LLAMACPP else "/srv/models/llama",
        state="verified",
    )
    spec = EngineSpec(
        model_path=version.source_path, served_model_name=name, port=port, api_key="k" * 32, **fields
    )
    argv = argv_of(spec)
    log.write_text("\n".join(lines) + "\n")
    deployment = Deployment.objects.create(
        name=name,
        model_version=version,
        engine=engine,
        host=host,
        gpu_indices=[] if engine == Engine.LLAMACPP else [0],
        port=port,
        served_model_name=name,
        state=DeploymentState.READY,
        launch_argv=argv,
        log_path=str(log),
        max_model_len=fields.get("max_model_len", 4096),
        gpu_memory_utilization=0.9 if engine == Engine.VLLM else None,
    )
    DeploymentEvent.objects.create(
        deployment=deployment,
        from_state=DeploymentState.PENDING,
        to_state=DeploymentState.STARTING,
        message="Engine started.",
        launch=launch_record(deployment, spec, argv, {"HOST": "127.0.0.1"}),
    )
    return deployment


@pytest.fixture
def two_kinds(tmp_path: Path, redis_clean: None) -> tuple[Deployment, Deployment]:
    host = Host.objects.create(
        name="kinds-a",
        address="127.0.0.1",
        state=HostState.ONLINE,
        last_heartbeat=timezone.now(),
        agent_info={
            "nvml": True,
            "simulated_gpus": False,
            "driver_version": "550.54.15",
            "cuda_driver_version": "12.4",
            "vllm_version": "0.11.0",
            "llama_cpp_version": "0.3.36",
        },
    )
    report_gpus(host, GpuSource(host.name, simulated_gpu_config("h100-llama3-8b-fp16", 1)).inventory())
    cpp = deploy(
        host,
        Engine.LLAMACPP,
        "smollm2-cpu",
        18101,
        llamacpp.build_argv,
        tmp_path / "cpp.log",
        [
            "llama_model_loader: loaded meta data with 33 key-value pairs",
            "INFO:     Uvicorn running on http://127.0.0.1:18101",
            *probe_lines(("/docs", "/v1/models"), 30),
            'INFO:     127.0.0.1:50000 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
            *probe_lines(("/docs", "/v1/models"), 5),
        ],
        max_model_len=2048,
        max_num_batched_tokens=256,
        extra_args=("--n_threads", "4"),
    )
    gpu = deploy(
        host,
        Engine.VLLM,
        "llama-gpu",
        18102,
        vllm.build_argv,
        tmp_path / "vllm.log",
        [
            "INFO 12-07 12:00:00 [api_server.py:1] vLLM API server version 0.11.0",
            *probe_lines(("/health", "/v1/models", "/metrics"), 20),
        ],
        gpu_indices=(0,),
        gpu_memory_utilization=0.9,
    )
    base = {"ts": timezone.now().timestamp(), "state": "ready", "alive": True, "ready": True}
    metrics = {"num_requests_running": 0.0, "num_requests_waiting": 0.0, "tokens_per_s": 0.0}
    r = get_redis()
    # llama.cpp serves no /metrics: the agent's record carries zeros and has_metrics false.
    r.set(
        live_deployment_key(cpp.pk),
        json.dumps({**base, **metrics, "kv_cache_usage_perc": 0.0, "has_metrics": False}),
        ex=300,
    )
    r.set(
        live_deployment_key(gpu.pk),
        json.dumps(
            {**base, **metrics, "kv_cache_usage_perc": 0.42, "tokens_per_s": 120.0} | {"has_metrics": True}
        ),
        ex=300,
    )
    return cpp, gpu


def test_each_engine_kind_shown_as_it_is(
    browser_page: Any, admin_user: User, two_kinds: tuple[Deployment, Deployment]
) -> None:
    cpp, gpu = two_kinds
    page = browser_page
    login(page, admin_user.username, PASSWORD)

    # Nodes page: the kind by its name; llama.cpp's KV cache "not reported", vLLM's as reported.
    page.goto("/nodes")
    expect(page.get_by_test_id(f"kv-{cpp.pk}")).to_have_text("not reported")
    expect(page.get_by_test_id(f"kv-{gpu.pk}")).to_have_text("42%")
    table = page.get_by_test_id("deployments-table")
    expect(table.locator("tr", has_text="smollm2-cpu")).to_contain_text("llama.cpp")
    expect(table.locator("tr", has_text="llama-gpu")).to_contain_text("vLLM")
    # A KV cache in use under 10 % keeps a decimal: 0.4 % used is not shown as an empty "0%".
    raw = get_redis().get(live_deployment_key(gpu.pk))
    assert raw is not None
    record = json.loads(raw)
    get_redis().set(live_deployment_key(gpu.pk), json.dumps({**record, "kv_cache_usage_perc": 0.004}), ex=300)
    page.reload()
    expect(page.get_by_test_id(f"kv-{gpu.pk}")).to_have_text("0.4%")
    get_redis().set(live_deployment_key(gpu.pk), json.dumps(record), ex=300)

    # Dashboard: the same per engine, and the llama.cpp pool's KV cache not reported (not 0 %).
    page.goto("/")
    expect(page.get_by_test_id(f"dash-kv-{cpp.pk}")).to_have_text("not reported")
    expect(page.get_by_test_id(f"dash-kv-{gpu.pk}")).to_have_text("42%")
    pools = page.get_by_test_id("pools-table")
    expect(pools.locator("tr", has_text="smollm2-cpu")).to_contain_text("not reported")
    expect(pools.locator("tr", has_text="llama-gpu")).to_contain_text("42% (42%)")

    # The llama.cpp deployment: llama-cpp-python's version, llama.cpp's settings, no vLLM ones.
    page.goto(f"/nodes/deployments/{cpp.pk}")
    expect(page.get_by_test_id("deployment-kv")).to_have_text("not reported")
    expect(page.get_by_test_id("deployment-tps")).to_have_text("not reported")
    expect(page.get_by_test_id("engine-charts-not-reported")).to_be_visible()
    expect(page.get_by_test_id("deployment-kv-chart")).to_have_count(0)
    expect(page.get_by_test_id("launch-engine")).to_have_text("llama.cpp (llama-cpp-python 0.3.36)")
    record = page.get_by_test_id("launch-record")
    expect(record).not_to_contain_text("vLLM")
    expect(record).not_to_contain_text("driver")
    settings = page.get_by_test_id("engine-settings")
    expect(settings).to_have_attribute("data-engine", "llamacpp")
    expect(settings).to_contain_text(f"GGUF file {GGUF}")
    expect(settings).to_contain_text("context size (n_ctx) 2048")
    expect(settings).to_contain_text("batch (n_batch) 256")
    expect(settings).to_contain_text("threads (n_threads) 4")
    expect(settings).to_contain_text("GPU layers (n_gpu_layers) 0")
    names = settings.get_by_test_id("engine-setting").all_inner_texts()
    assert names and not [n for n in names if n.startswith(VLLM_ONLY)], names

    # Its log tail: two runs of probes folded, with their counts; the other lines stay in view.
    tail = page.get_by_test_id("log-tail")
    expect(tail).to_have_attribute("data-probe-lines", str(2 * 35))
    folds = tail.get_by_test_id("log-probes")
    expect(folds).to_have_count(2)
    expect(folds.nth(0).locator("summary")).to_have_text("60 health-probe lines (/docs, /v1/models)")
    expect(folds.nth(1).locator("summary")).to_have_text("10 health-probe lines (/docs, /v1/models)")
    # The other lines stay in view; a fold is closed until it is clicked, and then shows its lines.
    expect(tail).to_contain_text("POST /v1/chat/completions", use_inner_text=True)
    expect(folds.nth(0)).to_have_js_property("open", False)
    folds.nth(0).locator("summary").click()
    expect(folds.nth(0)).to_have_js_property("open", True)
    expect(folds.nth(0)).to_contain_text('127.0.0.1:40000 - "GET /docs HTTP/1.1" 200 OK', use_inner_text=True)
    screenshot(page, "deployment-page-llamacpp")

    # The vLLM deployment: vLLM's version, driver and CUDA, and vLLM's settings.
    page.goto(f"/nodes/deployments/{gpu.pk}")
    expect(page.get_by_test_id("deployment-kv")).to_have_text("42%")
    expect(page.get_by_test_id("deployment-tps")).to_have_text("120 tokens/s")
    expect(page.get_by_test_id("launch-engine")).to_have_text("vLLM 0.11.0")
    expect(page.get_by_test_id("launch-record")).to_contain_text("driver 550.54.15 · CUDA 12.4")
    settings = page.get_by_test_id("engine-settings")
    expect(settings).to_have_attribute("data-engine", "vllm")
    expect(settings).to_contain_text("gpu_memory_utilization 0.9")
    expect(settings).not_to_contain_text("n_ctx")
    tail = page.get_by_test_id("log-tail")
    expect(tail).to_have_attribute("data-probe-lines", "60")
    expect(tail.get_by_test_id("log-probes").locator("summary")).to_have_text(
        "60 health-probe lines (/health, /v1/models, /metrics)"
    )
    expect(tail).to_contain_text("vLLM API server version 0.11.0")
