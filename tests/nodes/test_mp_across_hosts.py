"""One model across two hosts without Ray (multi_host_backend "mp"): two fleet agents (no database
settings) stand for two GPU hosts at 127.0.0.2 and 127.0.0.3. The member host's agent fetches nothing
(no store) and stands by; the head's agent launches the simulator with vLLM's multi-node command line
(`--nnodes 2 --node-rank 0 --master-addr 127.0.0.2`), the member's agent the same with `--node-rank 1
--headless`, and the head serves once the headless node has joined at the master port. The proxy serves
a chat completion from it to the `openai` client. Losing the headless node, then the whole member host
(agent and node), takes the deployment through crash and restart; it serves again once the host is
back, and stopping it leaves no node behind."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from models_registry.models import ModelAlias, ModelVersion
from nodes import process
from nodes.agent import ray_node
from nodes.agent_tokens import issue_agent_token
from nodes.choices import DeploymentState, Engine
from nodes.models import Deployment, DeploymentMember, Host
from nodes.services import request_stop
from tests.nodes.agent_channel import kill, start_agent, stop_engines_under, wait_for
from tests.nodes.conftest import free_port, make_host
from tests.nodes.test_ray_across_hosts import chat
from tests.routing.conftest import Proc, make_tenant_key, start_proxy  # noqa: F401 - fixture

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
ALIAS = "llama-3.1-8b"


def test_a_deployment_across_two_hosts_runs_without_ray_and_restarts_when_a_host_fails(
    live_server: Any,
    node_settings: Any,
    llama_version: ModelVersion,
    start_proxy: Any,  # noqa: F811
    redis_clean: None,
    tmp_path: Path,
) -> None:
    node_settings.NODE_STARTUP_TIMEOUT_SECONDS = 60.0
    head_host, member_host = make_host("gpu-head"), make_host("gpu-member")
    Host.objects.filter(pk=head_host.pk).update(address="127.0.0.2")
    Host.objects.filter(pk=member_host.pk).update(address="127.0.0.3")
    master_port = free_port()
    deployment = Deployment.objects.create(
        name="llama-pp2-mp",
        model_version=llama_version,
        engine=Engine.SIM,
        host=Host.objects.get(pk=head_host.pk),
        gpu_indices=[0],
        tensor_parallel_size=1,
        pipeline_parallel_size=2,
        multi_host_backend="mp",
        master_port=master_port,
        gpu_memory_utilization=0.45,
        max_model_len=4096,
        max_num_seqs=16,
        port=free_port(),
        served_model_name=ALIAS,
        extra_args=["--sim-time-scale", "50", "--sim-peer-timeout", "20"],
    )
    DeploymentMember.objects.create(deployment=deployment, host=member_host, stage=1, gpu_indices=[0])
    engines = tmp_path / "engines"
    head_dir, member_dir = engines / "gpu-head", engines / "gpu-member"
    head_log, member_log = tmp_path / "head-agent.log", tmp_path / "member-agent.log"

    def agent(host: Host, directory: Path, log: Path) -> Any:
        return start_agent(host.name, live_server.url, issue_agent_token(host).raw_token, directory, log)

    agents = [agent(head_host, head_dir, head_log), agent(member_host, member_dir, member_log)]
    began = time.monotonic()

    def current() -> Deployment:
        return Deployment.objects.get(pk=deployment.pk)

    def crashes() -> int:
        return current().events.filter(to_state=DeploymentState.CRASHED).count()

    def headless() -> ray_node.RayNode | None:
        return ray_node.adopt(member_dir).get(deployment.pk)

    try:
        wait_for(
            lambda: current().state == DeploymentState.READY, 60, "the engine ready on two hosts", head_log
        )
        ready = current()
        argv = ready.launch_argv
        flags = {name: argv[argv.index(name) + 1] for name in ("--nnodes", "--node-rank", "--master-addr")}
        assert flags == {"--nnodes": "2", "--node-rank": "0", "--master-addr": "127.0.0.2"}
        assert argv[argv.index("--distributed-executor-backend") + 1] == "mp"
        assert "--headless" not in argv
        node = headless()
        assert node is not None and node.backend == "mp" and node.launch_token == ready.start_token
        node_argv = Path(f"/proc/{node.pid}/cmdline").read_bytes().decode().split("\0")
        assert node_argv[node_argv.index("--node-rank") + 1] == "1" and "--headless" in node_argv
        assert node_argv[node_argv.index("--master-port") + 1] == str(master_port)
        engine_log = Path(ready.log_path).read_text()
        assert "Node rank 1 joined from 127.0.0.3 (2/2 nodes)." in engine_log, engine_log

        ModelAlias.objects.create(name=ALIAS, active_version=llama_version)
        proxy = start_proxy()
        key = make_tenant_key().raw_key
        assert chat(proxy, key)

        # The member's headless node dies: the launch crashes (the head's engine leaves with it) and the
        # next launch brings a new headless node.
        process.kill_session(node.pid)
        wait_for(lambda: crashes() >= 1, 20, "a crash after the headless node died", member_log)
        # Whichever side reports first: the member's agent (its node exited) or the head's (its engine
        # exited, its log naming the node that left).
        crash = current().events.filter(to_state=DeploymentState.CRASHED).first()
        assert crash is not None
        said = crash.message + crash.log_tail
        assert "node rank 1" in said, said
        wait_for(lambda: current().state == DeploymentState.READY, 60, "ready again", head_log)
        renewed = headless()
        assert renewed is not None and renewed.pid != node.pid
        assert renewed.launch_token == current().start_token != ready.start_token
        assert chat(proxy, key)

        # The whole member host fails (agent and node): crash, and no launch until it is back.
        before = crashes()
        kill(agents[1])
        process.kill_session(renewed.pid)
        wait_for(lambda: crashes() > before, 20, "a crash after the member host died", head_log)
        time.sleep(3.0)
        assert current().state != DeploymentState.READY, "ready without the member host"
        agents[1] = agent(member_host, member_dir, member_log)
        wait_for(lambda: current().state == DeploymentState.READY, 60, "ready with the host back", head_log)
        assert chat(proxy, key)

        # Stopping the deployment stops the engine and the headless node.
        last = headless()
        assert last is not None
        request_stop(current())
        wait_for(lambda: current().state == DeploymentState.STOPPED, 30, "stopped", head_log)
        wait_for(lambda: not process.is_alive(last.pid), 30, "the headless node gone", member_log)
        assert not ray_node.adopt(member_dir)
    finally:
        for running in agents:
            kill(running)
        stop_engines_under(engines)
    print(f"multi-host mp test body: {time.monotonic() - began:.1f} s")
