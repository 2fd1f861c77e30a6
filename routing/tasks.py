"""Celery tasks of routing, run by beat: request-log partitions and retention, the canary gates, and the
charts' history (rollups of GPU, engine, pool and tenant series). The pools' autoscaling and idle-sleep
tasks are in routing/scaling/tasks.py, imported here because Celery discovers only this module."""

from __future__ import annotations

from typing import Any

from core.celery import app
from routing import fleet_metrics
from routing.rollouts.services import evaluate_all
from routing.rollups import services as rollups
from routing.scaling import tasks as scaling_tasks  # noqa: F401 - registers the pools' scaling and sleep tasks
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


@app.task(name="routing.rollup_history")
def rollup_history_task() -> int:
    """Every 10 s: the 10 s points of every GPU, engine, pool and tenant, in one insert (idempotent:
    a bucket already written is skipped). Returns the rows offered."""
    return rollups.rollup_tick()


@app.task(name="routing.aggregate_history")
def aggregate_history_task() -> dict[str, int]:
    """Every 5 s: 1 min points from 10 s ones, a slice of hosts or the pools and tenants a run on
    PostgreSQL (rollups.aggregate_slice), every settled minute not yet written at once on SQLite;
    nothing when all are written (idempotent). Returns the rows written per resolution."""
    return {"60": rollups.aggregate(60).rows}


@app.task(name="routing.aggregate_history_hours")
def aggregate_history_hours_task() -> dict[str, int]:
    """Every 10 s: 1 h points from 1 min ones, as above (a whole hour took seconds at 1,000 hosts)."""
    return {"3600": rollups.aggregate(3600).rows}


@app.task(name="routing.prune_history")
def prune_history_task() -> dict[str, Any]:
    """Hourly: the history's coming partitions created, each resolution's partitions past its retention
    (HISTORY_KEEP_*) dropped (routing/rollups/partitions.py)."""
    return rollups.prune().as_dict()


@app.task(name="routing.refresh_fleet_metrics")
def refresh_fleet_metrics_task() -> bool:
    """Every second: the fleet exposition rendered ahead of FLEET_METRICS_MAX_AGE_SECONDS while someone
    scrapes /metrics (nothing otherwise); True when this run rendered."""
    return fleet_metrics.refresh_if_due()
