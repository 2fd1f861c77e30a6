"""One model across two hosts, with real Ray processes: two fleet agents (no database settings) stand for
two GPU hosts at 127.0.0.2 and 127.0.0.3. The head host's agent starts `ray start --head`, the other's
joins it, then the head's agent launches the simulator with vLLM's multi-node command line
(`--pipeline-parallel-size 2 --distributed-executor-backend ray`); the simulator joins the cluster and
holds a placement group with one GPU bundle on each host. The proxy serves a chat completion from it
to the `openai` client. Losing the worker host's Ray node (its agent reports it), and then the whole
worker host (agent and Ray killed), takes the deployment through crash and restart; it serves again
once the host is back. Every Ray process is gone at the end."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import OpenAI

from models_registry.models import ModelAlias, ModelVersion
from nodes import process
from nodes.agent import ray_node
from nodes.agent_tokens import issue_agent_token
from nodes.choices import DeploymentState, Engine
from nodes.models import Deployment, DeploymentMember, Host
from nodes.services import request_stop
from tests.nodes.agent_channel import agent_env, kill, wait_for
from tests.nodes.conftest import free_port, make_host
from tests.routing.conftest import Proc, make_tenant_key, start_proxy  # noqa: F401 - fixture

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
ALIAS = "llama-3.1-8b"

# Ray's failure detector, made fast for the test: a node that stops answering is dead after ~1.5 s
# (Ray's defaults take ~15 s). Read by the head's GCS, which inherits the agent's environment.
FAST_RAY_HEALTH = {
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_failure_threshold": "3",
    "RAY_health_check_initial_delay_ms": "0",
    "RAY_health_check_timeout_ms": "1000",
}


@pytest.fixture
def ray_temp_dir() -> Iterator[Path]:
    """A short temp dir for the cluster (Ray's socket paths must stay under 107 bytes); every process
    whose command line names it is ended at teardown, whatever the test did."""
    directory = Path(tempfile.mkdtemp(prefix="icray-", dir="/tmp"))
    yield directory
    for pid in ray_processes(directory):
        with contextlib.suppress(ProcessLookupError):
            process.kill_session(pid)
    shutil.rmtree(directory, ignore_errors=True)


def ray_processes(temp_dir: Path) -> list[int]:
    """Live processes of this test's Ray cluster: those whose command line names its temp dir."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if str(temp_dir).encode() in cmdline and process.is_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def start_agent(host: Host, url: str, engine_dir: Path, log: Path, temp_dir: Path) -> subprocess.Popen[bytes]:
    token = issue_agent_token(host).raw_token
    argv = [
        sys.executable, "-m", "nodes.agent", "--host", host.name, "--control-plane", url,
        "--engine-dir", str(engine_dir), "--simulated-gpus", "1",
    ]  # fmt: skip
    # The temp dir in the environment, not on the agent's command line: only Ray's processes name it.
    env = {**agent_env(token), **FAST_RAY_HEALTH, "INFERCHAIN_RAY_TEMP_DIR": str(temp_dir)}
    return subprocess.Popen(
        argv,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def chat(proxy: Proc, key: str, wait: float = 15.0) -> str:
    """A chat completion through the proxy, once it routes to the engine: the proxy learns of a
    deployment's new readiness from a config change and its next snapshot, a moment after the row."""
    client = OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0, timeout=20)
    deadline = time.monotonic() + wait
    while True:
        try:
            reply = client.chat.completions.create(
                model=ALIAS, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            return reply.choices[0].message.content or ""
        except openai.APIStatusError as exc:
            if time.monotonic() > deadline or exc.status_code not in (404, 503):
                raise
            time.sleep(0.3)


def test_a_deployment_across_two_hosts_runs_on_a_ray_cluster_and_restarts_when_a_host_fails(
    live_server: Any,
    node_settings: Any,
    llama_version: ModelVersion,
    start_proxy: Any,  # noqa: F811
    redis_clean: None,
    ray_temp_dir: Path,
    tmp_path: Path,
) -> None:
    node_settings.RAY_OBJECT_STORE_BYTES = 80 * 1024 * 1024
    node_settings.NODE_STARTUP_TIMEOUT_SECONDS = 60.0
    head_host = make_host("gpu-head")
    worker_host = make_host("gpu-worker")
    Host.objects.filter(pk=head_host.pk).update(address="127.0.0.2")
    Host.objects.filter(pk=worker_host.pk).update(address="127.0.0.3")
    deployment = Deployment.objects.create(
        name="llama-pp2",
        model_version=llama_version,
        engine=Engine.SIM,
        host=Host.objects.get(pk=head_host.pk),
        gpu_indices=[0],
        tensor_parallel_size=1,
        pipeline_parallel_size=2,
        ray_port=free_port(),
        gpu_memory_utilization=0.45,
        max_model_len=4096,
        max_num_seqs=16,
        port=free_port(),
        served_model_name=ALIAS,
        extra_args=["--sim-time-scale", "50"],
    )
    DeploymentMember.objects.create(deployment=deployment, host=worker_host, stage=1, gpu_indices=[0])
    head_dir, worker_dir = tmp_path / "engines" / "gpu-head", tmp_path / "engines" / "gpu-worker"
    head_log, worker_log = tmp_path / "head-agent.log", tmp_path / "worker-agent.log"
    agents = [
        start_agent(head_host, live_server.url, head_dir, head_log, ray_temp_dir),
        start_agent(worker_host, live_server.url, worker_dir, worker_log, ray_temp_dir),
    ]
    began = time.monotonic()

    def current() -> Deployment:
        return Deployment.objects.get(pk=deployment.pk)

    def crashes() -> int:
        return current().events.filter(to_state=DeploymentState.CRASHED).count()

    def worker_node() -> ray_node.RayNode | None:
        return ray_node.adopt(worker_dir).get(deployment.pk)

    try:
        wait_for(lambda: current().state == DeploymentState.READY, 60, "the engine ready on Ray", head_log)
        ready = current()
        argv = ready.launch_argv
        assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
        assert argv[argv.index("--tensor-parallel-size") + 1] == "1"
        assert argv[argv.index("--distributed-executor-backend") + 1] == "ray"
        launch = ready.events.filter(to_state=DeploymentState.STARTING).first()
        assert launch is not None and launch.launch is not None
        assert launch.launch["env"]["VLLM_HOST_IP"] == "127.0.0.2"
        # The Ray cluster: a head on gpu-head, a worker on gpu-worker, and the engine's placement group
        # has a GPU bundle on each.
        head = ray_node.adopt(head_dir)[deployment.pk]
        worker = worker_node()
        assert head.role == "head" and worker is not None and worker.role == "worker"
        assert "--node-ip-address 127.0.0.3" in " ".join(
            Path(f"/proc/{worker.pid}/cmdline").read_bytes().decode().split("\0")
        )
        engine_log = Path(ready.log_path).read_text()
        assert "placement group of 2 GPU bundles on node(s) 127.0.0.2, 127.0.0.3" in engine_log, engine_log

        ModelAlias.objects.create(name=ALIAS, active_version=llama_version)
        proxy = start_proxy()
        key = make_tenant_key().raw_key
        assert chat(proxy, key)

        # The worker host's Ray node dies; its agent reports it, the whole deployment crashes and
        # restarts once the agent has its node back in the cluster.
        process.kill_session(worker.pid)
        wait_for(lambda: crashes() >= 1, 20, "a crash after the worker's Ray node died", worker_log)
        messages = list(current().events.values_list("message", flat=True))
        assert any("The Ray worker node on gpu-worker exited" in m for m in messages), messages
        wait_for(lambda: current().state == DeploymentState.READY, 60, "ready again", head_log)
        assert chat(proxy, key)

        # The whole worker host fails (agent and Ray): crash, then the launch waits for its Ray node.
        worker = worker_node()
        assert worker is not None
        before = crashes()
        kill(agents[1])
        process.kill_session(worker.pid)
        wait_for(lambda: crashes() > before, 20, "a crash after the worker host died", head_log)
        assert current().state != DeploymentState.READY
        time.sleep(3.0)
        assert current().state != DeploymentState.READY, "ready without the worker host"
        agents[1] = start_agent(worker_host, live_server.url, worker_dir, worker_log, ray_temp_dir)
        wait_for(lambda: current().state == DeploymentState.READY, 60, "ready with the host back", head_log)
        assert chat(proxy, key)

        # Stopping the deployment stops the engine and both Ray nodes.
        request_stop(current())
        wait_for(lambda: current().state == DeploymentState.STOPPED, 30, "stopped", head_log)
        wait_for(lambda: not ray_processes(ray_temp_dir), 30, "every Ray process gone", head_log)
        assert not ray_node.adopt(head_dir) and not ray_node.adopt(worker_dir)
    finally:
        for agent in agents:
            kill(agent)
        ray_node.stop_all_under(tmp_path / "engines")
    print(f"multi-host Ray test body: {time.monotonic() - began:.1f} s")
