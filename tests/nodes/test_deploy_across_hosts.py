"""A deployment that spans hosts: accepted with its member hosts in stage order when each host can hold
its pipeline stage (1/PP of the layers and of the KV cache on tensor_parallel_size GPUs), refused with
the reason when not; vLLM's multi-node command line; the Ray nodes each host's agent is told to run."""

from __future__ import annotations

from typing import Any

import pytest

from nodes import agent_channel
from nodes.agent import ray_node
from nodes.agent.services import engine_spec
from nodes.choices import DeploymentState, Engine
from nodes.engines import get_adapter
from nodes.models import Deployment, DeploymentMember, Gpu, Host
from tests.nodes.conftest import free_port, make_host

pytestmark = pytest.mark.django_db
GIB = 1024**3


@pytest.fixture
def two_hosts(host: Host) -> tuple[Host, Host]:
    """Two hosts with one 16 GiB GPU each: Llama 3.1 8B in fp16 (~15 GiB of weights) fits on neither
    alone, and in two pipeline stages on both."""
    head, worker = make_host("gpu-head"), make_host("gpu-worker")
    Gpu.objects.filter(host__in=[head, worker]).update(memory_total_bytes=16 * GIB)
    return head, worker


def payload(version: Any, head: Host, *members: tuple[Host, list[int]], **overrides: Any) -> dict[str, Any]:
    data = {
        "name": "llama-pp",
        "model_version": version.pk,
        "engine": "sim",
        "host": head.pk,
        "gpu_indices": [0],
        "members": [{"host": h.pk, "gpu_indices": gpus} for h, gpus in members],
        "gpu_memory_utilization": 0.9,
        "max_model_len": 4096,
        "max_num_seqs": 16,
        "port": free_port(),
        "ray_port": free_port(),
        "served_model_name": "llama-3.1-8b",
    }
    data.update(overrides)
    return data


def refused(admin_client: Any, data: dict[str, Any]) -> dict[str, Any]:
    response = admin_client.post("/api/deployments/", data, format="json")
    assert response.status_code == 400, response.content
    assert not Deployment.objects.filter(name=data["name"]).exists()
    return response.json()


def test_a_model_too_big_for_one_host_is_placed_across_two(
    admin_client: Any, llama_version: Any, two_hosts: tuple[Host, Host]
) -> None:
    head, worker = two_hosts
    alone = refused(admin_client, payload(llama_version, head))
    assert "do not fit" in alone["fit"][0]

    response = admin_client.post(
        "/api/deployments/", payload(llama_version, head, (worker, [0])), format="json"
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["pipeline_parallel_size"] == 2 and body["tensor_parallel_size"] == 1
    assert body["members"] == [{"host": worker.pk, "host_name": "gpu-worker", "stage": 1, "gpu_indices": [0]}]
    assert body["fit"]["fits"] is True
    assert body["fit"]["reason"].startswith("Stage ") and "1/2 of the layers" in body["fit"]["reason"]
    member = DeploymentMember.objects.get(deployment_id=body["id"])
    assert (member.host, member.stage, member.gpu_indices) == (worker, 1, [0])
    listed = admin_client.get(f"/api/deployments/{body['id']}/").json()
    assert listed["members"][0]["host_name"] == "gpu-worker"


def test_hosts_that_cannot_hold_their_stage_are_refused_with_the_reason(
    admin_client: Any, llama_version: Any, two_hosts: tuple[Host, Host]
) -> None:
    head, worker = two_hosts
    Gpu.objects.filter(host=worker).update(memory_total_bytes=8 * GIB)
    errors = refused(admin_client, payload(llama_version, head, (worker, [0])))
    assert errors["fit"][0].startswith("Stage 1 on gpu-worker (1/2 of the layers"), errors


def test_bad_layouts_across_hosts_are_refused(
    admin_client: Any, llama_version: Any, two_hosts: tuple[Host, Host]
) -> None:
    head, worker = two_hosts
    errors = refused(admin_client, payload(llama_version, head, (worker, [0]), pipeline_parallel_size=3))
    assert (
        "runs one pipeline stage per host: pipeline_parallel_size must be 2"
        in errors["pipeline_parallel_size"][0]
    )
    errors = refused(admin_client, payload(llama_version, head, (worker, [0, 1])))
    assert any("gpu-worker gives 2 GPU(s)" in m for m in errors["members"]), errors
    errors = refused(admin_client, payload(llama_version, head, (worker, [5])))
    assert any("gpu-worker has no GPU 5" in m for m in errors["members"]), errors
    errors = refused(admin_client, payload(llama_version, head, (head, [0])))
    assert any("listed twice" in m for m in errors["members"]), errors
    errors = refused(
        admin_client, payload(llama_version, head, (worker, [0]), engine="llamacpp", gpu_indices=[])
    )
    assert any("Only vLLM engines" in m for m in errors["members"]), errors


def test_a_member_hosts_gpu_is_held_by_the_deployment_that_spans_it(
    admin_client: Any, llama_version: Any, two_hosts: tuple[Host, Host]
) -> None:
    head, worker = two_hosts
    spanning = payload(llama_version, head, (worker, [0]), gpu_memory_utilization=0.6)
    assert admin_client.post("/api/deployments/", spanning, format="json").status_code == 201
    small = payload(llama_version, worker, name="on-worker", gpu_memory_utilization=0.5, max_model_len=1024)
    errors = refused(admin_client, small)
    assert any("GPU 0 on gpu-worker is already taken: 'llama-pp' (60%)" in m for m in errors["gpu_indices"])


def spanning_deployment(version: Any, head: Host, worker: Host) -> Deployment:
    deployment = Deployment.objects.create(
        name="llama-pp",
        model_version=version,
        engine=Engine.SIM,
        host=head,
        gpu_indices=[0],
        tensor_parallel_size=1,
        pipeline_parallel_size=2,
        ray_port=6380,
        port=free_port(),
        served_model_name="llama-3.1-8b",
    )
    DeploymentMember.objects.create(deployment=deployment, host=worker, stage=1, gpu_indices=[0])
    return deployment


def test_the_engine_gets_vllms_multi_node_command_line(
    llama_version: Any, two_hosts: tuple[Host, Host]
) -> None:
    head, worker = two_hosts
    Host.objects.filter(pk=head.pk).update(address="10.0.0.2")
    head.refresh_from_db()
    deployment = spanning_deployment(llama_version, head, worker)
    deployment.engine = Engine.VLLM
    spec = engine_spec(deployment, python="/usr/bin/python3")
    argv = get_adapter(Engine.VLLM).build_argv(spec)
    joined = " ".join(argv)
    assert "--tensor-parallel-size 1" in joined and "--pipeline-parallel-size 2" in joined
    assert "--distributed-executor-backend ray" in joined
    env = get_adapter(Engine.VLLM).build_env(spec)
    assert env["RAY_ADDRESS"] == "10.0.0.2:6380" and env["VLLM_HOST_IP"] == "10.0.0.2"
    # On one host: no Ray executor, vLLM picks its own (multiprocessing).
    DeploymentMember.objects.filter(deployment=deployment).delete()
    single = get_adapter(Engine.VLLM).build_argv(engine_spec(deployment, python="/usr/bin/python3"))
    assert "--distributed-executor-backend" not in single


def test_each_host_is_told_its_ray_node_head_first(
    llama_version: Any, two_hosts: tuple[Host, Host], redis_clean: None, settings: Any
) -> None:
    head, worker = two_hosts
    settings.RAY_OBJECT_STORE_BYTES = 100_000_000
    deployment = spanning_deployment(llama_version, head, worker)

    def plans(host: Host) -> list[dict[str, Any]]:
        own = {d.pk: d for d in Deployment.objects.filter(host=host)}
        return agent_channel.ray_plans(host, own)

    (head_plan,) = plans(head)
    (worker_plan,) = plans(worker)
    assert head_plan["role"] == "head" and head_plan["wanted"] is True
    # A worker has nothing to join until the head's node has joined (vLLM's documented order).
    assert worker_plan["role"] == "worker" and worker_plan["wanted"] is False
    assert agent_channel.ray_nodes_missing(deployment) == ["gpu-head", "gpu-worker"]
    agent_channel.record_ray_nodes(head, [{"deployment_id": deployment.pk, "role": "head", "joined": True}])
    (worker_plan,) = plans(worker)
    assert worker_plan["wanted"] is True and worker_plan["head_address"] == "127.0.0.1:6380"
    assert agent_channel.ray_nodes_missing(deployment) == ["gpu-worker"]

    head_argv = ray_node.start_argv(head_plan, temp_dir="/tmp/r")
    assert head_argv[1:3] == ["start", "--block"]
    for part in ("--head", "--include-dashboard=false", "--temp-dir"):
        assert part in head_argv
    assert head_argv[head_argv.index("--port") + 1] == "6380"
    assert head_argv[head_argv.index("--num-gpus") + 1] == "1"
    assert head_argv[head_argv.index("--object-store-memory") + 1] == "100000000"
    worker_argv = ray_node.start_argv(worker_plan)
    assert worker_argv[worker_argv.index("--address") + 1] == "127.0.0.1:6380" and "--head" not in worker_argv
    assert ray_node.start_env(worker_plan) == {
        "VLLM_HOST_IP": "127.0.0.1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "CUDA_VISIBLE_DEVICES": "0",
    }

    # A stopped deployment runs no Ray node anywhere.
    Deployment.objects.filter(pk=deployment.pk).update(state=DeploymentState.STOPPED)
    assert not plans(head)[0]["wanted"] and not plans(worker)[0]["wanted"]


def test_a_host_without_the_fleet_agent_cannot_take_part(
    admin_client: Any, llama_version: Any, two_hosts: tuple[Host, Host]
) -> None:
    head, worker = two_hosts
    Host.objects.filter(pk=worker.pk).update(agent_info={"pid": 1, "nvml": False})
    errors = refused(admin_client, payload(llama_version, head, (worker, [0])))
    assert any("gpu-worker runs the co-located agent" in m for m in errors["members"]), errors


def test_two_clusters_cannot_share_a_heads_ray_port(
    admin_client: Any, llama_version: Any, two_hosts: tuple[Host, Host]
) -> None:
    head, worker = two_hosts
    Gpu.objects.filter(host__in=two_hosts).update(memory_total_bytes=80 * GIB)
    first = payload(llama_version, head, (worker, [0]), ray_port=None, gpu_memory_utilization=0.4)
    assert admin_client.post("/api/deployments/", first, format="json").status_code == 201
    second = payload(
        llama_version, head, (worker, [0]), name="llama-pp-2", ray_port=6379, gpu_memory_utilization=0.4
    )
    errors = refused(admin_client, second)
    assert "Ray port 6379 on gpu-head is the head of deployment 'llama-pp''s cluster" in errors["ray_port"][0]


# --- vLLM's multiprocessing executor across hosts (multi_host_backend "mp", no Ray) ---


def test_an_mp_deployment_gets_vllms_nnodes_command_line_on_every_host(
    llama_version: Any, two_hosts: tuple[Host, Host], redis_clean: None
) -> None:
    head, worker = two_hosts
    Host.objects.filter(pk=head.pk).update(address="10.0.0.2")
    Host.objects.filter(pk=worker.pk).update(address="10.0.0.3")
    head.refresh_from_db()
    deployment = spanning_deployment(llama_version, head, worker)
    Deployment.objects.filter(pk=deployment.pk).update(
        engine=Engine.VLLM, multi_host_backend="mp", master_port=29600, start_token="t1"
    )
    deployment.refresh_from_db()
    adapter = get_adapter(Engine.VLLM)
    spec = engine_spec(deployment, python="/usr/bin/python3")
    argv = adapter.build_argv(spec)

    def flag(args: list[str], name: str) -> str:
        return args[args.index(name) + 1]

    # vLLM's documented head launch (docs/serving/parallelism_scaling.md, "Running vLLM with
    # MultiProcessing").
    assert flag(argv, "--nnodes") == "2" and flag(argv, "--node-rank") == "0"
    assert flag(argv, "--master-addr") == "10.0.0.2" and flag(argv, "--master-port") == "29600"
    assert flag(argv, "--distributed-executor-backend") == "mp" and "--headless" not in argv
    env = adapter.build_env(spec)
    assert "RAY_ADDRESS" not in env and env["VLLM_HOST_IP"] == "10.0.0.2" and env["VLLM_API_KEY"]

    # The member host is told its headless node once the head's engine runs, not before.
    worker.refresh_from_db()
    (plan,) = agent_channel.ray_plans(worker, {})
    assert plan["backend"] == "mp" and plan["role"] == "worker" and plan["wanted"] is True
    assert plan["launch"] is None, "a headless node before the head's engine started"
    assert agent_channel.ray_plans(head, {deployment.pk: deployment}) == [], (
        "the head runs no node of its own"
    )
    # Its launch waits for the member only (the head has no node to wait for).
    assert agent_channel.ray_nodes_missing(deployment) == ["gpu-worker"]
    agent_channel.reconcile(deployment)
    held = Deployment.objects.get(pk=deployment.pk)
    assert held.state == DeploymentState.PENDING and held.start_token == "t1", "launched without its member"
    assert held.events.filter(message__startswith="Waiting for gpu-worker to stand by").count() == 1
    agent_channel.record_ray_nodes(
        worker, [{"deployment_id": deployment.pk, "role": "worker", "joined": True}]
    )
    assert agent_channel.ray_nodes_missing(deployment) == []

    Deployment.objects.filter(pk=deployment.pk).update(state=DeploymentState.STARTING)
    (plan,) = agent_channel.ray_plans(worker, {})
    member_argv = plan["launch"]["argv"]
    # The agent puts its own interpreter in, as for an engine.
    assert member_argv[:4] == [agent_channel.AGENT_PYTHON, "-m", "vllm.entrypoints.cli.main", "serve"]
    assert flag(member_argv, "--node-rank") == "1" and flag(member_argv, "--nnodes") == "2"
    assert flag(member_argv, "--master-addr") == "10.0.0.2" and "--headless" in member_argv
    member_env = plan["launch"]["env"]
    assert member_env["VLLM_HOST_IP"] == "10.0.0.3" and member_env["CUDA_VISIBLE_DEVICES"] == "0"
    assert "VLLM_API_KEY" not in member_env, "the engine key went to a host that serves no API"
    assert plan["start_token"] == "t1"

    # Crashed (backoff) or stopped: no headless node; stopped: not even standing by.
    Deployment.objects.filter(pk=deployment.pk).update(state=DeploymentState.CRASHED)
    assert agent_channel.ray_plans(worker, {})[0]["launch"] is None
    Deployment.objects.filter(pk=deployment.pk).update(state=DeploymentState.STOPPED)
    assert agent_channel.ray_plans(worker, {})[0]["wanted"] is False


def test_mp_deployments_are_checked_for_their_master_port(
    admin_client: Any, llama_version: Any, two_hosts: tuple[Host, Host]
) -> None:
    head, worker = two_hosts
    Gpu.objects.filter(host__in=two_hosts).update(memory_total_bytes=80 * GIB)
    first = payload(llama_version, head, (worker, [0]), multi_host_backend="mp", gpu_memory_utilization=0.3)
    response = admin_client.post("/api/deployments/", first, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["multi_host_backend"] == "mp" and response.json()["master_port"] is None
    second = payload(
        llama_version,
        head,
        (worker, [0]),
        name="llama-pp-2",
        multi_host_backend="mp",
        master_port=29501,
        gpu_memory_utilization=0.3,
    )
    errors = refused(admin_client, second)
    assert (
        "Master port 29501 on gpu-head is where the hosts of deployment 'llama-pp' meet"
        in errors["master_port"][0]
    )
    same = payload(
        llama_version,
        head,
        (worker, [0]),
        name="llama-pp-3",
        multi_host_backend="mp",
        gpu_memory_utilization=0.3,
    )
    same["master_port"] = same["port"]
    errors = refused(admin_client, same)
    assert errors["master_port"] == ["The master port cannot be the engine's port."]
    # A Ray cluster on the same head does not collide with the mp deployment's port, and vice versa.
    ray = payload(llama_version, head, (worker, [0]), name="llama-pp-ray", gpu_memory_utilization=0.3)
    assert admin_client.post("/api/deployments/", ray, format="json").status_code == 201
    errors = refused(admin_client, {**second, "multi_host_backend": "bogus"})
    assert "is not a valid choice" in errors["multi_host_backend"][0]
    errors = refused(admin_client, {**second, "extra_args": ["--nnodes", "3"]})
    assert "--nnodes" in str(errors["extra_args"])
