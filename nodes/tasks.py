"""Celery tasks of the nodes app. Thin: each takes ids and calls the agent runtime or services.

Deployment tasks run on the host's own queue (node.<host>), so they execute on the agent that
owns the engine; the heartbeat sweep runs on the control queue from beat. A pool's autoscaling and idle
sleep are routing's (routing/scaling/tasks.py), though the autoscaler's task names still begin "nodes.".
"""

from __future__ import annotations

from core.celery import app
from nodes.agent import runtime
from nodes.lifecycle import mark_unreachable_hosts


@app.task(name="nodes.launch_deployment", acks_late=True)
def launch_deployment(deployment_id: int) -> str:
    return runtime.launch(deployment_id)


@app.task(name="nodes.stop_deployment", acks_late=True)
def stop_deployment(deployment_id: int, drain: bool = False) -> str:
    return runtime.stop(deployment_id, drain=drain)


@app.task(name="nodes.restart_deployment", acks_late=True)
def restart_deployment(deployment_id: int) -> str:
    return runtime.restart(deployment_id)


@app.task(name="nodes.sleep_deployment", acks_late=True)
def sleep_deployment(deployment_id: int, level: int = 1, reason: str = "") -> str:
    return runtime.sleep(deployment_id, level, reason=reason)


@app.task(name="nodes.wake_deployment", acks_late=True)
def wake_deployment(deployment_id: int, reason: str = "") -> str:
    return runtime.wake(deployment_id, reason=reason)


@app.task(name="nodes.check_host_heartbeats")
def check_host_heartbeats() -> list[str]:
    """Mark hosts that missed heartbeats unreachable (beat runs it every 2 s)."""
    return mark_unreachable_hosts()
