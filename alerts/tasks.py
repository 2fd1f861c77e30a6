"""Celery tasks of alerts, run by beat: evaluate the rules, then send the webhook messages that are due."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings

from alerts.notify import deliver_due, due_ids
from alerts.services import evaluate
from core.celery import app


@app.task(name="alerts.evaluate")
def evaluate_alerts_task() -> dict[str, Any]:
    """Every ALERT_EVALUATE_INTERVAL_SECONDS. Idempotent: a re-run finds the same open alerts and owes no
    new message for them; messages from earlier runs still due (retries) go out with this run's."""
    result = evaluate().as_dict()
    if settings.ALERT_WEBHOOK_URL and due_ids(dt.datetime.now(dt.UTC)):
        # Its own task, so a slow webhook never delays the next evaluation.
        deliver_notifications_task.delay()
    return result


@app.task(name="alerts.deliver_notifications")
def deliver_notifications_task() -> dict[str, int]:
    """Send every due message once (row-locked: concurrent runs never send one twice)."""
    return deliver_due().as_dict()
