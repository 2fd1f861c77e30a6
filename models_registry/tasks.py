"""Celery tasks of the model registry: thin wrappers that take IDs and call services."""

from __future__ import annotations

from core.celery import app, enqueue_on_commit, node_queue
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
