"""A member host of a deployment spanning hosts fetches the model files before its Ray node starts.

vLLM's Ray workers on a member host load the model from the path the head's command line names, so
while the model store is active the member's agent is told (its Ray plan carries the head's fetch
spec) to fetch and verify the version into its own model root first, in its worker pool; a refused
file fails the deployment with the file and the host named, and no Ray node starts. Hosts whose
agents keep their files under different model roots are refused at deploy time.

No Ray cluster is needed for that: the member's agent runs in this process and reaches the real
control plane (agent_channel.sync, PostgreSQL and Redis) without HTTP; `ray_node.start` is replaced
by a recorder, the one thing not run, so the test sees what the files looked like when it was called.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from models_registry.choices import StoreKind
from models_registry.models import ModelStore, ModelVersion, VerificationRun
from models_registry.store import manifest_of, publish_to_directory
from nodes import agent_channel
from nodes.agent import ray_node
from nodes.agent.gpus import GpuSource, simulated_gpu_config
from nodes.agent.model_fetch import in_use_digests, remote_model_path
from nodes.agent.modelstore import COMPLETE_MARKER
from nodes.agent.remote import Agent
from nodes.choices import DeploymentState, Engine
from nodes.models import Deployment, DeploymentMember, Gpu, Host
from tests.modelstore.conftest import StoreServer, serve_store
from tests.nodes.conftest import free_port, make_host
from tests.nodes.test_deploy_across_hosts import GIB, payload, refused

pytestmark = pytest.mark.django_db


class DirectControlPlane:
    """The agent's side of the channel without HTTP: each batch goes to the real agent_channel.sync,
    through JSON both ways, as the API view hands it on."""

    def __init__(self, host_name: str) -> None:
        self.host_name = host_name

    def ready_for_call(self) -> bool:
        return True

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        assert path == "/api/agent/sync/"
        host = Host.objects.get(name=self.host_name)
        answer = agent_channel.sync(host, json.loads(json.dumps(body)))
        return dict(json.loads(json.dumps(answer)))


@pytest.fixture
def store_server(tmp_path: Path) -> Iterator[StoreServer]:
    with serve_store(tmp_path / "store") as server:
        yield server


@pytest.fixture
def http_store(store_server: StoreServer, llama_version: ModelVersion, node_settings: Any) -> ModelStore:
    """The version published into the store, served over HTTP; its source gone from this machine."""
    disk = ModelStore(name="disk", kind=StoreKind.DIRECTORY, location=str(store_server.root))
    publish_to_directory(llama_version, disk)
    shutil.rmtree(llama_version.source_path)
    node_settings.NODE_MODEL_FETCH_RETRIES = 2
    node_settings.NODE_MODEL_FETCH_RETRY_SECONDS = 0.05
    return ModelStore.objects.create(
        name="loopback", kind=StoreKind.HTTP, location=store_server.url(), is_active=True
    )


@pytest.fixture
def spanning(
    llama_version: ModelVersion, tmp_path: Path, redis_clean: None, node_settings: Any
) -> Deployment:
    """A deployment on gpu-head (stage 0) and gpu-member (stage 1); the head's agent reports the model
    root both hosts use, and its Ray node has joined (so the member's node is wanted)."""
    node_settings.NODE_LIVE_TTL_SECONDS = 120.0  # the head's "joined" holds for the test (no head agent)
    root = (tmp_path / "model-root").resolve()
    head, member = make_host("gpu-head"), make_host("gpu-member")
    Host.objects.filter(pk=head.pk).update(agent_info={"channel": "api", "model_root": str(root)})
    deployment = Deployment.objects.create(
        name="llama-pp2",
        model_version=llama_version,
        engine=Engine.SIM,
        host=Host.objects.get(pk=head.pk),
        gpu_indices=[0],
        tensor_parallel_size=1,
        pipeline_parallel_size=2,
        ray_port=free_port(),
        max_model_len=4096,
        port=free_port(),
        served_model_name="llama-3.1-8b",
    )
    DeploymentMember.objects.create(deployment=deployment, host=member, stage=1, gpu_indices=[0])
    agent_channel.record_ray_nodes(head, [{"deployment_id": deployment.pk, "joined": True}])
    return deployment


@pytest.fixture
def member_agent(tmp_path: Path, spanning: Deployment) -> Iterator[Agent]:
    agent = Agent(
        "gpu-member",
        DirectControlPlane("gpu-member"),  # type: ignore[arg-type]
        GpuSource("gpu-member", simulated_gpu_config("h100-llama3-8b-fp16", 1)),
        tmp_path / "engines" / "gpu-member",
        model_root=(tmp_path / "model-root").resolve(),
    )
    yield agent
    agent.pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture
def started_nodes(
    monkeypatch: pytest.MonkeyPatch, member_agent: Agent
) -> Iterator[list[tuple[dict[str, Any], bool]]]:
    """`ray_node.start` replaced: records (plan, whether the version's files were complete in the
    agent's model root at that moment) and stands a `sleep` process in for the node."""
    calls: list[tuple[dict[str, Any], bool]] = []
    sleepers: list[subprocess.Popen[bytes]] = []

    def start(plan: dict[str, Any], engine_dir: Path, *, temp_dir: str | None = None) -> ray_node.RayNode:
        digest = plan["fetch"]["digest"] if plan.get("fetch") else ""
        calls.append((plan, bool(digest) and (member_agent.model_root / digest / COMPLETE_MARKER).exists()))
        sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
        sleepers.append(sleeper)
        return ray_node.RayNode(
            deployment_id=int(plan["deployment_id"]),
            role=str(plan["role"]),
            pid=sleeper.pid,
            token="test",
            log_path="",
            head_address=str(plan["head_address"]),
            started_at=time.time(),
        )

    monkeypatch.setattr(ray_node, "start", start)
    yield calls
    for sleeper in sleepers:
        sleeper.kill()
        sleeper.wait(5)


def _until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_member_host_fetches_the_files_before_its_ray_node_starts(
    http_store: ModelStore,
    store_server: StoreServer,
    spanning: Deployment,
    member_agent: Agent,
    started_nodes: list[tuple[dict[str, Any], bool]],
) -> None:
    digest = spanning.model_version.manifest_digest
    # The fetch is held until released, so the syncs below happen while it runs.
    release = threading.Event()
    fetches: list[int] = []
    fetch_files = member_agent._fetch_files

    def held(deployment_id: int, start_token: str, fetch: dict[str, Any]) -> str:
        fetches.append(deployment_id)
        release.wait(30)
        return fetch_files(deployment_id, start_token, fetch)

    member_agent._fetch_files = held  # type: ignore[method-assign]

    member_agent.sync([], [])
    plan = member_agent.ray_plans[spanning.pk]
    assert plan["role"] == "worker" and plan["wanted"]
    assert plan["fetch"]["digest"] == digest
    assert plan["fetch"]["store"]["name"] == "loopback"
    member_agent.sync([], [])
    member_agent.sync([], [])
    _until(lambda: fetches == [spanning.pk], 10, "the member's fetch")
    assert started_nodes == [], "the Ray node started before the files were there"
    release.set()
    _until(lambda: spanning.pk in member_agent.ray_files, 30, "the member's fetch to end")
    assert fetches == [spanning.pk], "a second fetch was submitted while one ran"

    member_agent.sync([], [])

    assert len(started_nodes) == 1
    started_plan, files_complete = started_nodes[0]
    assert started_plan["role"] == "worker" and files_complete
    # The files lie at the very path the head's command line names.
    local = member_agent.model_root / digest
    assert remote_model_path(Deployment.objects.get(pk=spanning.pk)) == str(local)
    assert (local / "config.json").exists()
    assert Deployment.objects.get(pk=spanning.pk).state == DeploymentState.PENDING
    # Its cached copy is in use on the member while the deployment is active (never evicted for another).
    assert digest in in_use_digests("gpu-member")
    # The verified arrival is on record for the member host (the sync above sent the agent's report).
    assert member_agent.outbox == []
    runs = VerificationRun.objects.filter(version=spanning.model_version, trigger="fetch")
    assert [(r.host_name, r.ok, r.manifest_digest) for r in runs] == [("gpu-member", True, digest)]
    manifest = manifest_of(spanning.model_version)
    assert runs[0].files_checked == len(manifest)
    assert runs[0].bytes_hashed == sum(size for _, size, _ in manifest)


def test_a_member_hosts_refused_fetch_fails_the_deployment_naming_file_and_host(
    http_store: ModelStore,
    store_server: StoreServer,
    spanning: Deployment,
    member_agent: Agent,
    started_nodes: list[tuple[dict[str, Any], bool]],
) -> None:
    stored = store_server.root / spanning.model_version.manifest_digest / "config.json"
    data = bytearray(stored.read_bytes())
    data[-2] = ord(" ") if data[-2] != ord(" ") else ord("\n")
    stored.write_bytes(bytes(data))

    member_agent.sync([], [])
    _until(lambda: not member_agent.ray_fetching and bool(member_agent.outbox), 30, "the refused fetch")
    assert [c["kind"] for c in member_agent.outbox] == ["member_fetch_failed"]
    assert not VerificationRun.objects.filter(trigger="fetch").exists()
    member_agent.sync([], [])  # sends the change; the answer no longer wants the node

    failed = Deployment.objects.get(pk=spanning.pk)
    assert failed.state == DeploymentState.FAILED
    assert "Model files not fetched from 'loopback' on gpu-member" in failed.state_reason
    assert "config.json: corrupt: sha256" in failed.state_reason
    assert not member_agent.ray_plans[spanning.pk]["wanted"]
    assert member_agent.outbox == [] and started_nodes == []
    local = member_agent.model_root / spanning.model_version.manifest_digest
    assert not (local / COMPLETE_MARKER).exists()


def test_hosts_with_different_model_roots_are_refused_while_the_store_is_active(
    admin_client: Any, llama_version: ModelVersion, tmp_path: Path
) -> None:
    head, member = make_host("gpu-head"), make_host("gpu-member")
    Gpu.objects.filter(host__in=[head, member]).update(memory_total_bytes=16 * GIB)
    Host.objects.filter(pk=head.pk).update(agent_info={"channel": "api", "model_root": "/srv/models"})
    Host.objects.filter(pk=member.pk).update(agent_info={"channel": "api", "model_root": "/data/models"})
    head, member = Host.objects.get(pk=head.pk), Host.objects.get(pk=member.pk)
    store = ModelStore.objects.create(
        name="disk", kind=StoreKind.DIRECTORY, location=str(tmp_path / "store"), is_active=True
    )

    errors = refused(admin_client, payload(llama_version, head, (member, [0])))
    message = next(m for m in errors["members"] if "different model roots" in m)
    assert "gpu-head: /srv/models" in message and "gpu-member: /data/models" in message

    # Files read in place (no active store): the roots do not matter.
    ModelStore.objects.filter(pk=store.pk).update(is_active=False)
    data = payload(llama_version, head, (member, [0]))
    assert admin_client.post("/api/deployments/", data, format="json").status_code == 201
