"""Tasks are sent only after the transaction commits, to the queue asked for."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from core.celery import app, enqueue_on_commit, node_queue

pytestmark = pytest.mark.django_db(transaction=True)


class RecordingTask:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def apply_async(self, **kwargs: Any) -> None:
        self.calls.append(kwargs)


def test_enqueue_waits_for_commit_and_uses_queue() -> None:
    task = RecordingTask()
    with transaction.atomic():
        enqueue_on_commit(task, 7, queue=node_queue("gpu-a"))
        assert task.calls == []
    assert task.calls == [{"args": (7,), "kwargs": {}, "queue": "node.gpu-a"}]


def test_rolled_back_transaction_sends_nothing() -> None:
    task = RecordingTask()
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue_on_commit(task, 1)
        raise RuntimeError("boom")
    assert task.calls == []


def test_app_defaults_to_control_queue() -> None:
    assert app.conf.task_default_queue == "control"
    assert [q.name for q in app.conf.task_queues] == ["control"]


def test_beat_schedules_every_periodic_task_by_a_registered_name() -> None:
    app.loader.import_default_modules()
    schedule = app.conf.beat_schedule
    assert {entry["task"] for entry in schedule.values()} == {
        "nodes.check_host_heartbeats",
        "nodes.evaluate_scaling",
        "routing.prune_request_log",
        "routing.evaluate_rollouts",
        "routing.rollup_history",
        "routing.aggregate_history",
        "routing.aggregate_history_hours",
        "routing.prune_history",
        "routing.refresh_fleet_metrics",
        "routing.sleep_idle_engines",
        "alerts.evaluate",
    }
    for entry in schedule.values():
        assert entry["task"] in app.tasks
