"""Fixtures for node tests: a host with a simulated GPU, registered model versions, deployments,
and teardown that kills every engine process a test started."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from models_registry.models import ModelVersion, QuantizationConfig
from nodes import process
from nodes.agent.gpus import GpuSource, simulated_gpu_config
from nodes.agent.services import report_gpus
from nodes.agent.supervisor import Supervisor
from nodes.choices import DeploymentState, Engine, HostState
from nodes.demo import LLAMA_31_8B_CONFIG, write_config_dir
from nodes.models import Deployment, Host
from tests.ports import free_port


@pytest.fixture
def node_settings(settings: Any, tmp_path: Path) -> Any:
    """Fast supervision for tests; engine logs and model files under the test's tmp dir."""
    settings.ENGINE_LOG_DIR = tmp_path / "engines"
    settings.MODEL_ROOTS = [tmp_path / "models"]
    (tmp_path / "models").mkdir()
    settings.NODE_TELEMETRY_SECONDS = 0.2
    settings.NODE_HEARTBEAT_SECONDS = 0.5
    settings.NODE_RESTART_BACKOFF_SECONDS = 0.2
    settings.NODE_RESTART_BACKOFF_MAX_SECONDS = 1.0
    settings.NODE_STOP_TIMEOUT_SECONDS = 5.0
    settings.NODE_HANG_SECONDS = 3.0
    settings.NODE_STARTUP_TIMEOUT_SECONDS = 30.0
    return settings


def make_host(name: str = "node-a", gpus: int = 1, profile: str = "h100-llama3-8b-fp16") -> Host:
    host = Host.objects.create(
        name=name, address="127.0.0.1", state=HostState.ONLINE, last_heartbeat=timezone.now()
    )
    report_gpus(host, GpuSource(name, simulated_gpu_config(profile, gpus)).inventory())
    return host


@pytest.fixture
def host(db: None, node_settings: Any) -> Host:
    return make_host()


def register_llama(root: Path, host_name: str, revision: str = "fp16", quant: Any = None) -> ModelVersion:
    from models_registry.models import Model
    from models_registry.services import register_version

    model, _ = Model.objects.get_or_create(name="Llama-3.1-8B-Instruct")
    directory = write_config_dir(root / f"llama-{revision}", LLAMA_31_8B_CONFIG)
    return register_version(
        model=model, revision=revision, source_path=str(directory), quantization=quant, host_name=host_name
    )


@pytest.fixture
def llama_version(host: Host, node_settings: Any) -> ModelVersion:
    return register_llama(Path(node_settings.MODEL_ROOTS[0]), host.name)


@pytest.fixture
def awq_config(db: None) -> QuantizationConfig:
    return QuantizationConfig.objects.create(name="awq-int4", method="awq", bits=4, group_size=128)


@pytest.fixture
def make_deployment(host: Host, llama_version: ModelVersion) -> Callable[..., Deployment]:
    counter = iter(range(1000))

    def build(**fields: Any) -> Deployment:
        n = next(counter)
        values: dict[str, Any] = {
            "name": f"sim-{n}",
            "model_version": llama_version,
            "engine": Engine.SIM,
            "host": host,
            "gpu_indices": [0],
            "gpu_memory_utilization": 0.45,
            "max_model_len": 4096,
            "max_num_seqs": 16,
            "port": free_port(),
            "served_model_name": "llama-3.1-8b",
            "extra_args": ["--sim-time-scale", "50"],
        }
        values.update(fields)
        return Deployment.objects.create(**values)

    return build


@pytest.fixture(autouse=True)
def kill_engines(tmp_path: Path) -> Iterator[None]:
    """Every engine a test started (they log under tmp_path/engines) dies with the test."""
    yield
    for record_file in (tmp_path / "engines").rglob("deployment-*.json"):
        with contextlib.suppress(OSError, ValueError, TypeError):
            record = process.EngineRecord(**json.loads(record_file.read_text()))
            if process.is_alive(record.pid):
                os.killpg(record.pid, signal.SIGKILL)


def supervisor_for(host: Host) -> Supervisor:
    return Supervisor(host.name, GpuSource(host.name, simulated_gpu_config("h100-llama3-8b-fp16", 1)))


def tick_until(
    supervisor: Supervisor,
    deployment: Deployment,
    predicate: Callable[[Deployment], bool],
    timeout: float = 30.0,
    interval: float = 0.2,
) -> Deployment:
    """Run supervisor ticks until `predicate(deployment)` holds; fail with the state history if not."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        supervisor.tick()
        deployment.refresh_from_db()
        if predicate(deployment):
            return deployment
        time.sleep(interval)
    history = list(deployment.events.order_by("at").values_list("to_state", "message"))
    raise AssertionError(f"timed out; state={deployment.state} history={history}")


def in_state(*states: str) -> Callable[[Deployment], bool]:
    return lambda d: d.state in states


READY = in_state(DeploymentState.READY)


@pytest.fixture
def agents() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Fleet agent processes a test started (tests/nodes/agent_channel.start_agent); killed after it."""
    from tests.nodes.agent_channel import kill

    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        kill(proc)
