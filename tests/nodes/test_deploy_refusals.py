"""Bad deployments are refused with a clear message before anything starts."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from models_registry.models import VerificationRun
from nodes.choices import DeploymentState
from nodes.models import Deployment
from tests.nodes.conftest import free_port

pytestmark = pytest.mark.django_db


def payload(version: Any, host: Any, **overrides: Any) -> dict[str, Any]:
    data = {
        "name": "llama-long",
        "model_version": version.pk,
        "engine": "sim",
        "host": host.pk,
        "gpu_indices": [0],
        "gpu_memory_utilization": 0.5,
        "max_model_len": 8192,
        "max_num_seqs": 32,
        "port": free_port(),
        "served_model_name": "llama-3.1-8b",
        "role": "long-context",
    }
    data.update(overrides)
    return data


def refused(admin_client: Any, data: dict[str, Any]) -> dict[str, Any]:
    response = admin_client.post("/api/deployments/", data, format="json")
    assert response.status_code == 400, response.content
    assert not Deployment.objects.filter(name=data["name"]).exists()
    return response.json()


def test_a_good_deployment_is_accepted_with_its_fit_check(
    admin_client: Any, llama_version: Any, host: Any
) -> None:
    response = admin_client.post("/api/deployments/", payload(llama_version, host), format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["fit"]["fits"] is True
    assert body["fit"]["kv_tokens_available"] >= 8192
    assert body["state"] == DeploymentState.PENDING and body["desired_state"] == "running"


def fail_verification(version: Any, host_name: str) -> None:
    VerificationRun.objects.create(
        version=version,
        host_name=host_name,
        ok=False,
        manifest_digest=version.manifest_digest,
        problems=[{"path": "model.safetensors", "kind": "mismatch"}],
    )


def test_version_that_failed_verification_on_this_host(
    admin_client: Any, llama_version: Any, host: Any
) -> None:
    fail_verification(llama_version, host.name)
    errors = refused(admin_client, payload(llama_version, host))
    assert f"failed file verification on {host.name}" in errors["model_version"][0]


def test_a_failure_on_another_host_does_not_block_this_one(
    admin_client: Any, llama_version: Any, host: Any
) -> None:
    fail_verification(llama_version, "some-other-host")
    response = admin_client.post("/api/deployments/", payload(llama_version, host), format="json")
    assert response.status_code == 201, response.content


def test_unreachable_host(admin_client: Any, llama_version: Any, host: Any) -> None:
    host.last_heartbeat = timezone.now() - timedelta(minutes=5)
    host.save()
    errors = refused(admin_client, payload(llama_version, host))
    assert "unreachable" in errors["host"][0]


def test_port_in_use_by_another_deployment(
    admin_client: Any, llama_version: Any, host: Any, make_deployment: Any
) -> None:
    other = make_deployment(gpu_memory_utilization=0.2)
    errors = refused(admin_client, payload(llama_version, host, port=other.port))
    assert f"Port {other.port}" in errors["port"][0] and other.name in errors["port"][0]


def test_gpu_already_taken(admin_client: Any, llama_version: Any, host: Any, make_deployment: Any) -> None:
    make_deployment(gpu_memory_utilization=0.6, state=DeploymentState.READY)
    errors = refused(admin_client, payload(llama_version, host, gpu_memory_utilization=0.5))
    assert "already taken" in errors["gpu_indices"][0]
    assert "at most 0.40" in errors["gpu_indices"][0]


def test_two_engines_can_share_a_gpu_when_they_fit(
    admin_client: Any, llama_version: Any, host: Any, make_deployment: Any
) -> None:
    make_deployment(gpu_memory_utilization=0.45, state=DeploymentState.READY)
    response = admin_client.post(
        "/api/deployments/", payload(llama_version, host, gpu_memory_utilization=0.45), format="json"
    )
    assert response.status_code == 201, response.content


def test_max_model_len_above_the_model_limit(admin_client: Any, llama_version: Any, host: Any) -> None:
    limit = llama_version.max_context
    errors = refused(admin_client, payload(llama_version, host, max_model_len=limit + 1))
    assert f"{limit:,}" in errors["max_model_len"][0]


def test_does_not_fit_in_gpu_memory(admin_client: Any, llama_version: Any, host: Any) -> None:
    # 10% of an 80 GB GPU cannot hold 16 GB of fp16 weights.
    errors = refused(admin_client, payload(llama_version, host, gpu_memory_utilization=0.1))
    assert "do not fit" in errors["fit"][0]


def test_console_owned_flags_cannot_be_overridden(admin_client: Any, llama_version: Any, host: Any) -> None:
    errors = refused(admin_client, payload(llama_version, host, extra_args=["--api-key", "mine"]))
    assert "--api-key" in errors["extra_args"][0]


def test_unknown_gpu_and_tensor_parallel_mismatch(admin_client: Any, llama_version: Any, host: Any) -> None:
    errors = refused(admin_client, payload(llama_version, host, gpu_indices=[0, 3], tensor_parallel_size=1))
    assert "tensor_parallel_size" in errors
    assert "no GPU 3" in errors["gpu_indices"][0]


def test_batched_tokens_below_max_num_seqs(admin_client: Any, llama_version: Any, host: Any) -> None:
    errors = refused(admin_client, payload(llama_version, host, max_num_batched_tokens=8))
    assert ">= max_num_seqs" in errors["max_num_batched_tokens"][0]


def test_preflight_endpoint_reports_without_creating(
    admin_client: Any, llama_version: Any, host: Any
) -> None:
    data = payload(llama_version, host, max_model_len=9_999_999)
    data.pop("name")
    data.pop("served_model_name")
    data.pop("role")
    response = admin_client.post("/api/deployments/preflight/", data, format="json")
    assert response.status_code == 200
    body = response.json()
    assert body["ok"] is False and "max_model_len" in body["errors"]
    assert Deployment.objects.count() == 0


def test_viewers_cannot_deploy(viewer_client: Any, llama_version: Any, host: Any) -> None:
    response = viewer_client.post("/api/deployments/", payload(llama_version, host), format="json")
    assert response.status_code == 403
