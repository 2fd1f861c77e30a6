"""Stop every engine the agents on this machine started, and keep them stopped (for `make stop`).

Agents leave engines running when they exit so that a restarted agent re-adopts them; this is the
explicit way to take a local fleet down. Killing the processes alone does not stick: an agent that
still runs sees an engine that should run and is gone, and relaunches it. So the deployments of the
hosts whose engines live here are first marked desired-stopped, the way a stop from the console is,
and then their engines are ended. The next `make run` starts exactly those again (nodes.demo).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from nodes import process
from nodes.agent import ray_node
from nodes.choices import DeploymentState, DesiredState
from nodes.demo import STOPPED_BY_MAKE_STOP
from nodes.lifecycle import transition
from nodes.models import Deployment

_CLEARED: dict[str, Any] = {"ready_at": None, "next_restart_at": None}


def stop_local_engines(timeout: float = 10.0) -> tuple[list[int], list[int]]:
    """Stop each engine recorded under the engine directory.

    Returns (deployment ids whose engine was stopped, deployment ids marked desired-stopped).
    """
    directory = Path(settings.ENGINE_LOG_DIR)
    hosts = [p.name for p in directory.iterdir() if p.is_dir()] if directory.is_dir() else []
    # A FAILED deployment has no engine and no agent relaunches it: it stays as it is.
    wanted = list(
        Deployment.objects.filter(host__name__in=hosts, desired_state=DesiredState.RUNNING).exclude(
            state=DeploymentState.FAILED
        )
    )
    # Desired state first: from here on no agent launches, restarts or re-adopts them.
    Deployment.objects.filter(pk__in=[d.pk for d in wanted]).update(desired_state=DesiredState.STOPPED)

    stopped = []
    for state_path in sorted(directory.glob("*/deployment-*.json")):
        record = process.read_record(state_path.parent, int(state_path.stem.removeprefix("deployment-")))
        if record is None:
            continue
        # A pid reused by an unrelated process never carries the start token: leave it alone.
        if process.is_alive(record.pid) and process.carries_token(record.pid, record.start_token):
            process.stop_engine(record.pid, timeout)
            stopped.append(record.deployment_id)
        process.forget_record(state_path.parent, record.deployment_id)
    # The Ray nodes of deployments across hosts: their sessions, whole (raylet, GCS, Ray's workers).
    ray_node.stop_all_under(directory)

    for deployment in wanted:
        transition(deployment, DeploymentState.STOPPED, STOPPED_BY_MAKE_STOP, pid=None, **_CLEARED)
    # Engines already asked to stop whose agent is gone: their rows must not claim they still run.
    leftover = Deployment.objects.filter(pk__in=stopped, desired_state=DesiredState.STOPPED).exclude(
        state=DeploymentState.STOPPED
    )
    for deployment in leftover:
        transition(deployment, DeploymentState.STOPPED, "Engine stopped by make stop.", pid=None, **_CLEARED)
    return stopped, [d.pk for d in wanted]


class Command(BaseCommand):
    help = "Stop the engine processes started by node agents on this machine, and keep them stopped."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--timeout", type=float, default=10.0, help="seconds before SIGKILL")

    def handle(self, *args: Any, **options: Any) -> None:
        stopped, marked = stop_local_engines(options["timeout"])
        self.stdout.write(
            f"stopped {len(stopped)} engine(s)" + (f": deployments {stopped}" if stopped else "")
        )
        if marked:
            self.stdout.write(
                f"{len(marked)} deployment(s) marked stopped, so no agent relaunches them; "
                "the next make run starts them again"
            )
