"""The real co-located agent process (`manage.py run_agent`, for single-machine installs): a Celery
worker consuming node.<host> plus the supervisor. (The fleet agent, `python -m nodes.agent`, is
tested in test_agent_without_database.py.) Deploy through the API -> ready; the agent dies and comes
back -> the engine is re-adopted, not duplicated; stop through the API -> stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from nodes import process
from nodes.choices import DeploymentState, HostState
from nodes.models import Deployment, Host
from tests.nodes.conftest import free_port, register_llama

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; agent log:\n{process.tail(log, 60)}")


@pytest.fixture
def start_agent(tmp_path: Path, node_settings: Any) -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    db = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_KEY_PREFIX": settings.REDIS_KEY_PREFIX,
        "ENGINE_LOG_DIR": str(tmp_path / "engines"),
        "MODEL_ROOTS": str(tmp_path / "models"),
        "NODE_TELEMETRY_SECONDS": "0.3",
        "NODE_HEARTBEAT_SECONDS": "0.5",
        "NODE_RESTART_BACKOFF_SECONDS": "0.3",
    }
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        log = (tmp_path / "agent.log").open("ab")
        proc = subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "run_agent",
                "node-p",
                "--simulated-gpus",
                "1",
                "--concurrency",
                "2",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_deploy_survive_agent_restart_and_stop(
    start_agent: Any, admin_client: Any, tmp_path: Path, node_settings: Any
) -> None:
    log = tmp_path / "agent.log"
    agent = start_agent()
    wait_for(
        lambda: Host.objects.filter(name="node-p", state=HostState.ONLINE).exists(), 60, "heartbeat", log
    )
    host = Host.objects.get(name="node-p")
    assert host.gpus.get().simulated is True
    assert "No NVIDIA GPU" in host.agent_info["gpu_note"]
    version = register_llama(Path(node_settings.MODEL_ROOTS[0]), host.name)

    response = admin_client.post(
        "/api/deployments/",
        {
            "name": "through-the-queue",
            "model_version": version.pk,
            "engine": "sim",
            "host": host.pk,
            "gpu_indices": [0],
            "gpu_memory_utilization": 0.5,
            "max_model_len": 4096,
            "max_num_seqs": 16,
            "port": free_port(),
            "served_model_name": "llama-3.1-8b",
            "extra_args": ["--sim-time-scale", "50"],
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    pk = response.json()["id"]

    def state() -> str:
        return Deployment.objects.get(pk=pk).state

    wait_for(lambda: state() == DeploymentState.READY, 60, "ready", log)
    engine_pid = Deployment.objects.get(pk=pk).pid
    assert engine_pid is not None

    # The agent dies; the engine keeps serving, and the next agent adopts it.
    os.killpg(agent.pid, signal.SIGKILL)
    agent.wait(10)
    assert process.is_alive(engine_pid)
    start_agent()
    # The row still says READY from before: wait for the new agent's own word, not a fixed sleep.
    wait_for(lambda: "re-adopted deployment" in log.read_text(), 60, "re-adoption", log)
    wait_for(lambda: state() == DeploymentState.READY, 30, "ready after agent restart", log)
    assert Deployment.objects.get(pk=pk).pid == engine_pid

    response = admin_client.post(f"/api/deployments/{pk}/stop/", {}, format="json")
    assert response.status_code == 202, response.content
    wait_for(lambda: state() == DeploymentState.STOPPED, 30, "stopped", log)
    assert not process.is_alive(engine_pid)
