"""Hosts through the API: admins set name, address, role and cost; GPUs and heartbeats are the agent's."""

from __future__ import annotations

from typing import Any

import pytest

from nodes.agent.services import record_heartbeat
from nodes.models import Host

pytestmark = pytest.mark.django_db


def test_admin_registers_a_host_and_agent_fields_are_read_only(admin_client: Any) -> None:
    response = admin_client.post(
        "/api/hosts/",
        {"name": "gpu-7", "address": "10.0.0.7", "role": "long-context", "cost_per_hour": "3.10"},
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["agent_queue"] == "node.gpu-7"
    assert body["state"] == "unknown" and body["reachable"] is False and body["gpus"] == []

    refused = admin_client.patch(
        f"/api/hosts/{body['id']}/", {"last_heartbeat": "2030-01-01T00:00:00Z"}, format="json"
    )
    assert refused.status_code == 400 and "last_heartbeat" in refused.json()
    assert Host.objects.get(pk=body["id"]).last_heartbeat is None


def test_host_names_become_queue_names_so_they_are_checked(admin_client: Any) -> None:
    response = admin_client.post("/api/hosts/", {"name": "GPU 7; rm", "address": "x"}, format="json")
    assert response.status_code == 400 and "name" in response.json()


def test_gpus_come_from_the_agent_with_live_values(viewer_client: Any, host: Any) -> None:
    body = viewer_client.get(f"/api/hosts/{host.pk}/").json()
    assert body["reachable"] is True
    gpu = body["gpus"][0]
    assert gpu["simulated"] is True and gpu["memory_total_bytes"] > 0 and gpu["index"] == 0


def test_a_host_with_deployments_cannot_be_deleted(
    admin_client: Any, make_deployment: Any, host: Any
) -> None:
    make_deployment()
    response = admin_client.delete(f"/api/hosts/{host.pk}/")
    assert response.status_code == 400 and Host.objects.filter(pk=host.pk).exists()


def test_draining_host_refuses_new_deployments_until_undrained(
    admin_client: Any, host: Any, llama_version: Any
) -> None:
    body = admin_client.post(f"/api/hosts/{host.pk}/drain/").json()
    assert body["state"] == "draining"
    record_heartbeat(host.name, {})  # the agent's heartbeat does not end a drain
    host.refresh_from_db()
    assert host.state == "draining"
    deploy = {
        "name": "late",
        "model_version": llama_version.pk,
        "engine": "sim",
        "host": host.pk,
        "gpu_indices": [0],
        "port": 18601,
        "served_model_name": "llama-3.1-8b",
    }
    refused = admin_client.post("/api/deployments/", deploy, format="json")
    assert refused.status_code == 400 and "draining" in refused.json()["host"][0]

    assert admin_client.post(f"/api/hosts/{host.pk}/undrain/").json()["state"] == "online"
    assert admin_client.post("/api/deployments/", deploy, format="json").status_code == 201
