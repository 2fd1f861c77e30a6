"""What the API asks of deployments and hosts: desired-state actions (start, stop, restart, drain) that
enqueue work on the host's own queue, and draining a host. State changes go through lifecycle.transition.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from core.celery import app, enqueue_on_commit
from core.redis_client import publish_config_change
from nodes.agent_channel import request_drain, uses_agent_channel
from nodes.choices import SLEEP_CAPABLE_ENGINES, SLEEP_LEVELS, DeploymentState, DesiredState, HostState
from nodes.lifecycle import host_is_reachable, record_event, request_wake, transition
from nodes.models import Deployment, Host

# The agent's tasks (nodes/tasks.py), sent by name: nodes.tasks runs the scaler, which asks these
# services for launches and drains, so importing the task objects here would close an import cycle.
LAUNCH_TASK = "nodes.launch_deployment"
STOP_TASK = "nodes.stop_deployment"
RESTART_TASK = "nodes.restart_deployment"
SLEEP_TASK = "nodes.sleep_deployment"
WAKE_TASK = "nodes.wake_deployment"


def _enqueue(task_name: str, deployment: Deployment, **kwargs: Any) -> None:
    """Send the task to the agent of the deployment's host once the transaction commits.

    An agent on the agent channel has no queue: it learns the new desired state at its next sync. Sleep
    and wake are the exception: they are calls to the engine's port with its key (runtime.sleep/wake),
    which the control plane's own worker makes for such a host (its agent leaves a sleeper alone).
    """
    if uses_agent_channel(deployment.host):
        if task_name in (SLEEP_TASK, WAKE_TASK):
            enqueue_on_commit(app.signature(task_name), deployment.pk, **kwargs)  # the control queue
        return
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
        if drain and uses_agent_channel(deployment.host):
            request_drain(deployment.pk)
        _enqueue(STOP_TASK, deployment, drain=drain)
    return deployment


def request_restart(deployment: Deployment) -> Deployment:
    with transaction.atomic():
        Deployment.objects.filter(pk=deployment.pk).update(
            desired_state=DesiredState.RUNNING, restart_count=0, next_restart_at=None
        )
        deployment.desired_state = DesiredState.RUNNING
        record_event(deployment, "Restart requested.")
        if uses_agent_channel(deployment.host):
            # The agent stops the engine it sees in STOPPING, and its "stopped" brings it back to PENDING.
            if deployment.state in (
                DeploymentState.STARTING,
                DeploymentState.READY,
                DeploymentState.DEGRADED,
            ):
                transition(deployment, DeploymentState.STOPPING, "Restarting the engine.")
            elif deployment.state != DeploymentState.STOPPING:
                transition(deployment, DeploymentState.PENDING, "Restart: launching again.", pid=None)
        _enqueue(RESTART_TASK, deployment)
    return deployment


class SleepRefused(ValueError):
    """A sleep or wake that cannot be done, with the field it is about and why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def sleep_problems(engine: str, level: int | None) -> dict[str, str]:
    """Why sleep cannot be configured for an engine kind at a level ({} when it can)."""
    problems: dict[str, str] = {}
    if engine not in SLEEP_CAPABLE_ENGINES:
        problems["engine"] = (
            f"The {engine} engine has no sleep mode (only vLLM and the vLLM simulator do); "
            "leave sleep off or deploy with vLLM."
        )
    if level is not None and level not in SLEEP_LEVELS:
        problems["sleep_level"] = (
            f"Sleep level must be 1 (weights to host memory) or 2 (weights dropped), not {level}."
        )
    return problems


def request_sleep(deployment: Deployment, level: int, reason: str = "Sleep requested.") -> Deployment:
    """Ask the host's agent to put a ready engine to sleep at `level` (it confirms with /is_sleeping)."""
    problems = sleep_problems(deployment.engine, level)
    if problems:
        field, message = next(iter(problems.items()))
        raise SleepRefused("level" if field == "sleep_level" else field, message)
    if not deployment.sleep_enabled or "--enable-sleep-mode" not in (deployment.launch_argv or []):
        raise SleepRefused(
            "sleep_enabled",
            "This engine runs without sleep mode; enable sleep on it (or its pool) and restart it first.",
        )
    if deployment.state != DeploymentState.READY:
        raise SleepRefused("state", f"Only a ready engine can sleep; this one is {deployment.state}.")
    with transaction.atomic():
        record_event(deployment, f"{reason} (level {level})")
        _enqueue(SLEEP_TASK, deployment, level=level, reason=reason)
    return deployment


def request_wake_up(deployment: Deployment, reason: str = "Wake requested.") -> Deployment:
    """Ask the host's agent to wake a sleeping engine: a task on its queue, and the wake key its
    supervisor loop also watches (so a lost task costs one tick, not the wake)."""
    if deployment.state != DeploymentState.SLEEPING:
        raise SleepRefused("state", f"Only a sleeping engine can be woken; this one is {deployment.state}.")
    with transaction.atomic():
        record_event(deployment, reason)
        _enqueue(WAKE_TASK, deployment, reason=reason)
    request_wake(deployment.pk)
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
