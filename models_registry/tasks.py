"""Celery tasks of the model registry: thin wrappers that take IDs and call services."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model

from core.celery import app, enqueue_on_commit, node_queue
from models_registry.evaluation.models import FINISHED_STATES, EvalRun
from models_registry.evaluation.runner import LOCK_SECONDS, execute_run
from models_registry.models import ModelVersion
from models_registry.quantize import quantize_version
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


@app.task(name="models_registry.quantize_version", acks_late=True)
def quantize_version_task(
    source_id: int, target_type: str, revision: str, nthread: int = 0, actor_id: int | None = None
) -> int:
    """Make `target_type` from a GGUF version and register it (models_registry.quantize); returns its id.

    Idempotent: a redelivery after the version was registered returns that version.
    """
    done = ModelVersion.objects.filter(
        revision=revision, provenance__source_version=source_id, provenance__target_type=target_type
    ).first()
    if done is not None:
        return done.pk
    actor = get_user_model().objects.filter(pk=actor_id).first() if actor_id is not None else None
    return quantize_version(source_id, target_type, revision=revision, nthread=nthread, actor=actor).pk


def enqueue_quantize(source: ModelVersion, target_type: str, revision: str, nthread: int, actor: Any) -> None:
    """Quantize on the control queue once the current transaction commits (where registration runs too:
    model paths are the same on every host)."""
    actor_id = actor.pk if getattr(actor, "pk", None) else None
    enqueue_on_commit(quantize_version_task, source.pk, target_type, revision, nthread, actor_id)
