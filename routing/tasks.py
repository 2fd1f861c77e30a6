"""Celery tasks of routing, run by beat: request-log partitions and retention, and the canary gates."""

from __future__ import annotations

from typing import Any

from core.celery import app
from routing.rollouts.services import evaluate_all
from routing.services import maintain_request_log


# The name predates partitions; kept so that queued messages and beat schedules still match.
@app.task(name="routing.prune_request_log")
def prune_request_log_task() -> dict[str, Any]:
    """Idempotent: creates the coming days' partitions, drops (SQLite: deletes) what is past retention."""
    return maintain_request_log().as_dict()


@app.task(name="routing.evaluate_rollouts")
def evaluate_rollouts_task() -> dict[str, str]:
    """The canary gates, every ROLLOUT_GATE_INTERVAL_SECONDS: advance, hold, promote or roll back each one."""
    return {str(k): v for k, v in evaluate_all().items()}
