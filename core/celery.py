"""The Celery app: queue `control` for the control plane, `node.<host>` for each node agent."""

from __future__ import annotations

import gc
import os
from typing import Any

from celery import Celery
from celery.signals import worker_process_init
from django.db import transaction
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inferchain.settings")

app = Celery("inferchain")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_queues = [Queue("control")]
app.conf.task_default_queue = "control"
app.autodiscover_tasks()


@worker_process_init.connect
def leave_the_workers_process_group(**_: Any) -> None:
    """Put a prefork pool child in a process group of its own, so only the worker's main process hears a stop.

    honcho (`make run`, `make stop`, Ctrl-C) signals each Procfile process's whole group, as supervisord's
    stopasgroup and a terminal's ^C do. Celery's warm shutdown is the main process's SIGTERM: it stops
    taking tasks, waits for the running ones and then ends its children. A child that got the SIGTERM
    itself died in the middle of its task instead (`WorkerLostError ... signal 15` logged at ERROR, the
    task redelivered and run twice). Out of the group, a child still ends with its parent: Celery sets
    it a parent-death signal (SIGKILL) before this runs, so honcho's SIGKILL of the group after its
    grace period leaves no child behind. Thread and solo pools have no children and never call this.
    """
    os.setpgid(0, 0)


def freeze_heap() -> None:
    """Collect once, then move every object alive now into the collector's permanent generation.

    A worker process holds about 200,000 tracked objects once Django, Celery and the tasks are
    imported, and a full (generation 2) collection walks all of them: 94 ms here. A task that
    allocates much triggers one: an alert evaluation (13,000 live records read) did in nearly every
    run, 82-94 ms of a 450 ms run at 1,000 hosts (benchmarks/alert_evaluation.py). Frozen, a full
    collection walks only what tasks made since. Objects frozen are never freed, so it runs once, at
    the start, after a collection (Python's docs, gc.freeze)."""
    gc.collect()
    gc.freeze()


@worker_process_init.connect
def freeze_the_imports(**_: Any) -> None:
    """A prefork pool child's heap after start-up is its imports: frozen (freeze_heap)."""
    freeze_heap()


def node_queue(host_name: str) -> str:
    """The queue a node agent for `host_name` consumes."""
    return f"node.{host_name}"


def enqueue_on_commit(task: Any, *args: Any, queue: str = "control", **kwargs: Any) -> None:
    """Send `task` after the transaction commits, so a worker never sees a row that is not there."""
    transaction.on_commit(lambda: task.apply_async(args=args, kwargs=kwargs, queue=queue))
