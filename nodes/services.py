"""What the API asks of deployments and hosts: desired-state actions (start, stop, restart, drain) that
enqueue work on the host's own queue, and draining a host. State changes go through lifecycle.transition.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from core.celery import app, enqueue_on_commit
from core.redis_client import publish_config_change
from nodes.choices import DeploymentState, DesiredState, HostState
from nodes.lifecycle import host_is_reachable, record_event, transition
from nodes.models import Deployment, Host

# The agent's tasks (nodes/tasks.py), sent by name: nodes.tasks runs the scaler, which asks these
# services for launches and drains, so importing the task objects here would close an import cycle.
LAUNCH_TASK = "nodes.launch_deployment"
STOP_TASK = "nodes.stop_deployment"
RESTART_TASK = "nodes.restart_deployment"


def _enqueue(task_name: str, deployment: Deployment, **kwargs: Any) -> None:
    """Send the task to the agent of the deployment's host once the transaction commits."""
    enqueue_on_commit(app.signature(task_name), deployment.pk, queue=deployment.host.agent_queue, **kwargs)


def request_start(deployment: Deployment, message: str = "Start requested.") -> Deployment:
    """Ask the host's agent to (re)launch the deployment; a fresh start resets its failure count."""
    with transaction.atomic():
        Deployment.objects.filter(pk=deployment.pk).update(
            desired_state=DesiredState.RUNNING, restart_count=0, next_restart_at=None
        )
        deployment.desired_state = DesiredState.RUNNING
        deployment.restart_count = 0
        if deployment.state in (DeploymentState.STOPPED, DeploymentState.FAILED, DeploymentState.CRASHED):
            transition(deployment, DeploymentState.PENDING, message)
        else:
            record_event(deployment, message)
        _enqueue(LAUNCH_TASK, deployment)
    return deployment


def request_stop(deployment: Deployment, *, drain: bool = False) -> Deployment:
    """Ask the agent to stop the engine; with drain, it first waits for in-flight requests to finish."""
    with transaction.atomic():
        Deployment.objects.filter(pk=deployment.pk).update(desired_state=DesiredState.STOPPED)
        deployment.desired_state = DesiredState.STOPPED
        if deployment.state in (DeploymentState.FAILED, DeploymentState.PENDING) and not deployment.pid:
            transition(deployment, DeploymentState.STOPPED, "Stopped before an engine was running.")
        elif deployment.state != DeploymentState.STOPPED:
            transition(
                deployment,
                DeploymentState.STOPPING,
                "Draining: no new requests; stopping when in-flight ones finish."
                if drain
                else "Stop requested.",
            )
        _enqueue(STOP_TASK, deployment, drain=drain)
    return deployment


def request_restart(deployment: Deployment) -> Deployment:
    with transaction.atomic():
        Deployment.objects.filter(pk=deployment.pk).update(
            desired_state=DesiredState.RUNNING, restart_count=0, next_restart_at=None
        )
        deployment.desired_state = DesiredState.RUNNING
        record_event(deployment, "Restart requested.")
        _enqueue(RESTART_TASK, deployment)
    return deployment


def set_host_draining(host: Host, draining: bool) -> Host:
    """Draining: the host takes no new deployments (preflight refuses them); its engines keep serving."""
    with transaction.atomic():
        locked = Host.objects.select_for_update().get(pk=host.pk)
        if draining:
            locked.state = HostState.DRAINING
        elif locked.state == HostState.DRAINING:
            locked.state = HostState.ONLINE if host_is_reachable(locked) else HostState.UNREACHABLE
        locked.save(update_fields=["state", "updated_at"])
        publish_config_change("host", name=locked.name, state=locked.state)
    host.state = locked.state
    return host
