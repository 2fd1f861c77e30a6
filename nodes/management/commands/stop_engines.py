"""Stop every engine process the agents on this machine started (for `make stop`).

Agents leave engines running when they exit so that a restarted agent re-adopts them; this is the
explicit way to take a local fleet down. Desired states stay as they are: the next agent start
launches again whatever should run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from nodes import process


def stop_local_engines(timeout: float = 10.0) -> list[int]:
    """Stop each engine recorded under the engine directory; returns the deployment ids stopped."""
    stopped = []
    for state_path in sorted(Path(settings.ENGINE_LOG_DIR).glob("*/deployment-*.json")):
        record = process.read_record(state_path.parent, int(state_path.stem.removeprefix("deployment-")))
        if record is None:
            continue
        # A pid reused by an unrelated process never carries the start token: leave it alone.
        if process.is_alive(record.pid) and process.carries_token(record.pid, record.start_token):
            process.stop_engine(record.pid, timeout)
            stopped.append(record.deployment_id)
        process.forget_record(state_path.parent, record.deployment_id)
    return stopped


class Command(BaseCommand):
    help = "Stop the engine processes started by node agents on this machine."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--timeout", type=float, default=10.0, help="seconds before SIGKILL")

    def handle(self, *args: Any, **options: Any) -> None:
        stopped = stop_local_engines(options["timeout"])
        self.stdout.write(
            f"stopped {len(stopped)} engine(s)" + (f": deployments {stopped}" if stopped else "")
        )
