"""Celery tasks of routing: request-log partitions and retention, run hourly by beat."""

from __future__ import annotations

from typing import Any

from core.celery import app
from routing.services import maintain_request_log


# The name predates partitions; kept so that queued messages and beat schedules still match.
@app.task(name="routing.prune_request_log")
def prune_request_log_task() -> dict[str, Any]:
    """Idempotent: creates the coming days' partitions, drops (SQLite: deletes) what is past retention."""
    return maintain_request_log().as_dict()
