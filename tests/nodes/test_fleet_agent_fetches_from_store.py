"""A fleet agent's host (the agent channel, no database) fetches a version from the model store into its
own model root before it starts the engine; the control plane never reads the files (their source is
gone from this machine). A tampered file fails the launch with the file named, through the agent's
queued change."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from models_registry.choices import StoreKind
from models_registry.models import ModelStore, VerificationRun
from models_registry.store import manifest_of, publish_to_directory
from nodes.agent.modelstore import COMPLETE_MARKER
from nodes.agent_tokens import issue_agent_token
from nodes.choices import DeploymentState
from nodes.models import Deployment, Host
from tests.modelstore.conftest import StoreServer, serve_store
from tests.nodes.agent_channel import kill, start_agent, wait_for

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def store_server(tmp_path: Path) -> Iterator[StoreServer]:
    with serve_store(tmp_path / "store") as server:
        yield server


@pytest.fixture
def http_store(store_server: StoreServer, llama_version: Any, node_settings: Any) -> ModelStore:
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
def agent(live_server: Any, host: Host, tmp_path: Path) -> Iterator[Callable[[], Path]]:
    """Starts the host's fleet agent; returns its model root (the default, under its engine dir)."""
    started: list[subprocess.Popen[bytes]] = []
    engine_dir = tmp_path / "engines"
    token = issue_agent_token(host).raw_token

    def start() -> Path:
        started.append(start_agent(host.name, live_server.url, token, engine_dir, tmp_path / "agent.log"))
        return engine_dir.resolve() / "model-cache"

    yield start
    for proc in started:
        kill(proc)


def _current(deployment: Deployment) -> Deployment:
    return Deployment.objects.get(pk=deployment.pk)


def test_fleet_agent_runs_the_engine_from_the_files_it_fetched(
    http_store: ModelStore,
    agent: Callable[[], Path],
    make_deployment: Callable[..., Deployment],
    tmp_path: Path,
) -> None:
    model_root = agent()
    log = tmp_path / "agent.log"
    wait_for(lambda: "connected" in log.read_text(), 30, "the first sync", log)
    deployment = make_deployment()
    local = model_root / deployment.model_version.manifest_digest

    wait_for(lambda: _current(deployment).state == DeploymentState.READY, 60, "ready", log)

    ready = _current(deployment)
    assert (local / COMPLETE_MARKER).exists()
    assert str(local) in ready.launch_argv
    messages = "\n".join(ready.events.values_list("message", flat=True))
    assert f"Fetching model files from the store 'loopback' on {ready.host.name}" in messages
    # The agent's verified arrival is on record for its host, once (the control plane read no file).
    runs = VerificationRun.objects.filter(version=ready.model_version, trigger="fetch")
    manifest = manifest_of(ready.model_version)
    assert [(r.host_name, r.ok, r.files_checked, r.bytes_hashed) for r in runs] == [
        (ready.host.name, True, len(manifest), sum(size for _, size, _ in manifest))
    ]
    assert runs[0].fetch_key == f"{ready.pk}:{ready.start_token}:{ready.host.name}"


def test_fleet_agent_refuses_a_tampered_file_naming_it(
    http_store: ModelStore,
    store_server: StoreServer,
    agent: Callable[[], Path],
    make_deployment: Callable[..., Deployment],
    tmp_path: Path,
) -> None:
    model_root = agent()
    log = tmp_path / "agent.log"
    wait_for(lambda: "connected" in log.read_text(), 30, "the first sync", log)
    deployment = make_deployment()
    stored = store_server.root / deployment.model_version.manifest_digest / "config.json"
    data = bytearray(stored.read_bytes())
    data[-2] = ord(" ") if data[-2] != ord(" ") else ord("\n")
    stored.write_bytes(bytes(data))

    wait_for(lambda: _current(deployment).state == DeploymentState.FAILED, 60, "failed", log)

    failed = _current(deployment)
    assert failed.pid is None
    assert "Model files not fetched from 'loopback'" in failed.state_reason
    assert "config.json: corrupt: sha256" in failed.state_reason
    local = model_root / deployment.model_version.manifest_digest
    assert not (local / "config.json").exists() and not (local / COMPLETE_MARKER).exists()
    assert not VerificationRun.objects.filter(trigger="fetch").exists()
