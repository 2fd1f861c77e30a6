"""Routine periodic tasks stay out of the INFO log; other tasks, and any failure, stay in it."""

from __future__ import annotations

import logging

import pytest
from celery.app.trace import LOG_RECEIVED, LOG_SUCCESS


def emit(logger: str, template: str, task: str) -> None:
    context = {"name": task, "id": "0f0f", "runtime": 0.01, "return_value": [], "args": "", "kwargs": ""}
    logging.getLogger(logger).info(template, context)


def test_heartbeat_sweep_lines_are_dropped_at_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    emit("celery.app.trace", LOG_SUCCESS, "nodes.check_host_heartbeats")
    emit("celery.worker.strategy", LOG_RECEIVED, "nodes.check_host_heartbeats")
    logging.getLogger("celery.beat").info(
        "Scheduler: Sending due task %s (%s)", "nodes-host-heartbeat-sweep", "nodes.check_host_heartbeats"
    )
    emit("celery.app.trace", LOG_SUCCESS, "nodes.launch_deployment")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["Task nodes.launch_deployment[0f0f] succeeded in 0.01s: []"]


def test_a_failing_routine_task_is_still_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    logging.getLogger("celery.app.trace").error(
        "Task %s[%s] raised unexpected: %r", "nodes.check_host_heartbeats", "1", "x"
    )
    assert len(caplog.records) == 1


def test_at_debug_the_routine_lines_come_back(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    emit("celery.app.trace", LOG_SUCCESS, "nodes.check_host_heartbeats")
    assert len(caplog.records) == 1
