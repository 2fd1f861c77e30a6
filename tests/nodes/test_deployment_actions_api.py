"""Deployment actions through the API: each changes desired state, records history and audit, and
queues the work on the host's own Celery queue."""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from core.models import AuditEvent
from core.redis_client import get_redis
from nodes.choices import DeploymentState, DesiredState
from nodes.models import Host

pytestmark = pytest.mark.django_db


def queued_tasks(host_name: str) -> list[tuple[str, list[Any], dict[str, Any]]]:
    """(task name, args, kwargs) of the messages waiting on node.<host> in the real Redis broker."""
    out = []
    # Kombu LPUSHes and BRPOPs: the list holds the newest message first.
    for raw in reversed(get_redis().lrange(f"{settings.REDIS_KEY_PREFIX}node.{host_name}", 0, -1)):
        message = json.loads(raw)
        args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
        out.append((message["headers"]["task"], args, kwargs))
    return out


def test_create_queues_the_launch_on_the_hosts_queue(
    admin_client: Any,
    llama_version: Any,
    host: Any,
    redis_clean: None,
    django_capture_on_commit_callbacks: Any,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(
            "/api/deployments/",
            {
                "name": "queued",
                "model_version": llama_version.pk,
                "engine": "sim",
                "host": host.pk,
                "gpu_indices": [0],
                "port": 18555,
                "served_model_name": "llama-3.1-8b",
                "max_model_len": 4096,
            },
            format="json",
        )
    assert response.status_code == 201, response.content
    assert queued_tasks(host.name) == [("nodes.launch_deployment", [response.json()["id"]], {})]


def test_stop_drain_restart_start(
    admin_client: Any,
    make_deployment: Any,
    host: Any,
    redis_clean: None,
    django_capture_on_commit_callbacks: Any,
) -> None:
    deployment = make_deployment(state=DeploymentState.READY, pid=999999)
    url = f"/api/deployments/{deployment.pk}"

    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(f"{url}/drain/", {}, format="json")
    assert response.status_code == 202
    body = response.json()
    assert (body["desired_state"], body["state"]) == (DesiredState.STOPPED, DeploymentState.STOPPING)
    assert body["state_reason"].startswith("Draining")
    assert queued_tasks(host.name)[-1] == ("nodes.stop_deployment", [deployment.pk], {"drain": True})

    with django_capture_on_commit_callbacks(execute=True):
        assert admin_client.post(f"{url}/restart/", {}, format="json").status_code == 202
    assert queued_tasks(host.name)[-1][0] == "nodes.restart_deployment"

    deployment.refresh_from_db()
    assert deployment.desired_state == DesiredState.RUNNING
    actions = list(
        AuditEvent.objects.filter(object_id=str(deployment.pk), action="action").values_list(
            "after", flat=True
        )
    )
    assert {"action": "drain", "drain": True} in actions and {"action": "restart"} in actions
    events = list(deployment.events.values_list("message", flat=True))
    assert "Restart requested." in events


def test_start_refused_while_the_host_is_unreachable(
    admin_client: Any, make_deployment: Any, host: Any
) -> None:
    deployment = make_deployment(state=DeploymentState.STOPPED, desired_state=DesiredState.STOPPED)
    Host.objects.filter(pk=host.pk).update(last_heartbeat=timezone.now() - timedelta(minutes=10))
    response = admin_client.post(f"/api/deployments/{deployment.pk}/start/", {}, format="json")
    assert response.status_code == 400
    assert "unreachable" in response.json()["host"][0]


def test_viewer_cannot_act_and_active_deployments_cannot_be_deleted(
    viewer_client: Any, admin_client: Any, make_deployment: Any
) -> None:
    deployment = make_deployment(state=DeploymentState.READY)
    assert viewer_client.post(f"/api/deployments/{deployment.pk}/stop/", {}, format="json").status_code == 403
    assert viewer_client.get(f"/api/deployments/{deployment.pk}/").status_code == 200
    response = admin_client.delete(f"/api/deployments/{deployment.pk}/")
    assert response.status_code == 400 and "Stop the deployment first" in response.json()["state"][0]


def test_engine_parameters_cannot_change_while_running(admin_client: Any, make_deployment: Any) -> None:
    deployment = make_deployment(state=DeploymentState.READY)
    response = admin_client.patch(
        f"/api/deployments/{deployment.pk}/", {"max_model_len": 2048}, format="json"
    )
    assert response.status_code == 400 and "Stop the deployment" in response.json()["max_model_len"][0]


def test_log_tail_comes_from_the_engine_log(admin_client: Any, make_deployment: Any, tmp_path: Any) -> None:
    log = tmp_path / "engine.log"
    log.write_text("".join(f"line {i}\n" for i in range(500)))
    deployment = make_deployment(log_path=str(log))
    body = admin_client.get(f"/api/deployments/{deployment.pk}/logs/?lines=3").json()
    assert body["source"] == "file" and body["lines"] == ["line 497", "line 498", "line 499"]
