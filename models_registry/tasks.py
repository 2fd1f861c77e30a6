"""Celery tasks of the model registry: thin wrappers that take IDs and call services."""

from __future__ import annotations

from typing import Any

from core.celery import app, enqueue_on_commit, node_queue
from models_registry.evaluation.models import FINISHED_STATES, EvalRun
from models_registry.evaluation.runner import LOCK_SECONDS, execute_run
from models_registry.models import ModelVersion
from models_registry.services import verify_version_on_host


@app.task(name="models_registry.verify_version", acks_late=True)
def verify_version(version_id: int, host_name: str) -> int:
    """Re-hash a version's files on `host_name` (runs on queue node.<host>); returns the run's id.

    Idempotent: each call records one more run, and the version's state follows the latest run per host.
    """
    return verify_version_on_host(version_id, host_name, trigger="task").pk


def enqueue_verification(version: ModelVersion, host_name: str) -> None:
    """Ask the node agent of `host_name` to verify the version, once the current transaction commits."""
    enqueue_on_commit(verify_version, version.pk, host_name, queue=node_queue(host_name))


@app.task(
    name="models_registry.run_evaluation",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    max_retries=240,
)
def run_evaluation(self: Any, run_id: int) -> str | None:
    """Run or resume an evaluation run (models_registry.evaluation.runner.execute_run); returns its state.

    Idempotent: a finished run is left alone, and a resumed one runs only the cases without a sample.
    While another worker holds the run's lock (it is working, or it died less than LOCK_SECONDS ago and
    its lock has not lapsed yet) the task tries again after LOCK_SECONDS, so a resume sent right after a
    worker was killed still happens.
    """
    run = execute_run(run_id)
    if run is None:
        if EvalRun.objects.filter(pk=run_id, state__in=FINISHED_STATES).exists():
            return None
        raise self.retry(countdown=LOCK_SECONDS)
    return run.state


def enqueue_evaluation(run_id: int) -> None:
    """Start (or resume) a run once the current transaction commits."""
    enqueue_on_commit(run_evaluation, run_id)
