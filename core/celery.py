"""The Celery app: queue `control` for the control plane, `node.<host>` for each node agent."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from django.db import transaction
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inferchain.settings")

app = Celery("inferchain")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_queues = [Queue("control")]
app.conf.task_default_queue = "control"
app.autodiscover_tasks()


def node_queue(host_name: str) -> str:
    """The queue a node agent for `host_name` consumes."""
    return f"node.{host_name}"


def enqueue_on_commit(task: Any, *args: Any, queue: str = "control", **kwargs: Any) -> None:
    """Send `task` after the transaction commits, so a worker never sees a row that is not there."""
    transaction.on_commit(lambda: task.apply_async(args=args, kwargs=kwargs, queue=queue))
