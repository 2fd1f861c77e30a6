"""A launch with an active model store fetches the version into the host's own model root and runs it
from there; a corrupt file or a dead store fails the launch with the reason, in the deployment's events."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from models_registry.choices import StoreKind
from models_registry.models import ModelStore, VerificationRun
from models_registry.store import publish_to_directory
from nodes.agent import runtime
from nodes.agent.modelstore import COMPLETE_MARKER
from nodes.choices import DeploymentState
from nodes.lifecycle import engine_api_key
from nodes.probes import http_get
from tests.modelstore.conftest import StoreServer, serve_store
from tests.nodes.conftest import READY, supervisor_for, tick_until

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def store_server(tmp_path: Path) -> Iterator[StoreServer]:
    with serve_store(tmp_path / "store") as server:
        yield server


@pytest.fixture
def http_store(
    store_server: StoreServer, llama_version: Any, node_settings: Any, tmp_path: Path
) -> ModelStore:
    """The version published into the store's directory, served over HTTP; its source gone from this host."""
    disk = ModelStore(name="disk", kind=StoreKind.DIRECTORY, location=str(store_server.root))
    publish_to_directory(llama_version, disk)
    shutil.rmtree(llama_version.source_path)
    node_settings.NODE_MODEL_ROOT = tmp_path / "host-model-root"
    node_settings.NODE_MODEL_FETCH_RETRIES = 2
    node_settings.NODE_MODEL_FETCH_RETRY_SECONDS = 0.05
    return ModelStore.objects.create(
        name="loopback", kind=StoreKind.HTTP, location=store_server.url(), is_active=True
    )


def _messages(deployment: Any) -> str:
    return "\n".join(deployment.events.values_list("message", flat=True))


@pytest.mark.slow
def test_engine_runs_from_the_files_fetched_into_its_hosts_model_root(
    http_store: ModelStore, make_deployment: Any, host: Any, node_settings: Any
) -> None:
    deployment = make_deployment()
    version = deployment.model_version
    local = Path(node_settings.NODE_MODEL_ROOT) / version.manifest_digest

    assert runtime.launch(deployment.pk) == "started"

    assert (local / COMPLETE_MARKER).exists()
    deployment = tick_until(supervisor_for(host), deployment, READY)
    assert "Fetching model files from the store 'loopback'" in _messages(deployment)
    assert str(local) in deployment.launch_argv
    models = http_get(
        "127.0.0.1", deployment.port, "/v1/models", timeout=2, api_key=engine_api_key(deployment)
    )
    assert str(local).encode() in models.body
    run = VerificationRun.objects.get(version=version, host_name=host.name, trigger="fetch")
    assert run.ok and run.files_checked == version.file_count


def test_changed_file_in_the_store_fails_the_launch_naming_it(
    http_store: ModelStore, store_server: StoreServer, make_deployment: Any, node_settings: Any
) -> None:
    deployment = make_deployment()
    stored = store_server.root / deployment.model_version.manifest_digest / "config.json"
    stored.write_text(stored.read_text().replace("}", ', "tampered": 1}', 1))

    assert runtime.launch(deployment.pk) == "fetch failed"

    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.FAILED and deployment.pid is None
    assert "config.json: oversized file" in deployment.state_reason
    assert "Model files not fetched from 'loopback'" in _messages(deployment)
    local = Path(node_settings.NODE_MODEL_ROOT) / deployment.model_version.manifest_digest
    assert not (local / "config.json").exists() and not (local / COMPLETE_MARKER).exists()


def test_same_size_tampering_is_refused_as_corrupt(
    http_store: ModelStore, store_server: StoreServer, make_deployment: Any
) -> None:
    deployment = make_deployment()
    stored = store_server.root / deployment.model_version.manifest_digest / "config.json"
    data = bytearray(stored.read_bytes())
    data[-2] = ord(" ") if data[-2] != ord(" ") else ord("\n")
    stored.write_bytes(bytes(data))

    assert runtime.launch(deployment.pk) == "fetch failed"

    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.FAILED
    assert "config.json: corrupt: sha256" in deployment.state_reason


def test_unreachable_store_fails_the_launch_with_the_reason(
    http_store: ModelStore, make_deployment: Any
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    http_store.location = f"http://127.0.0.1:{closed}/store"
    http_store.save()
    deployment = make_deployment()

    assert runtime.launch(deployment.pk) == "fetch failed"

    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.FAILED
    assert "the model store did not answer after 2 retries" in deployment.state_reason
    assert f"127.0.0.1:{closed}" in deployment.state_reason
