"""Celery tasks of routing: request-log retention, run hourly by beat."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from console.celery import app


@shared_task(name="routing.prune_request_log")
def prune_request_log_task() -> int:
    """Idempotent: deletes whatever is past retention now."""
    from routing.services import prune_request_log

    return prune_request_log()


@app.on_after_configure.connect
def schedule_pruning(sender: Any, **_: Any) -> None:
    sender.add_periodic_task(3600.0, prune_request_log_task.s(), name="prune request log hourly")
