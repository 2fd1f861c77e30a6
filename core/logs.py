"""Log filters that keep routine work out of INFO, so an idle install logs only what someone should read."""

from __future__ import annotations

import logging

# Periodic tasks that run every few seconds: their "sending", "received" and "succeeded" lines would be
# most of an idle install's log (three lines every two seconds for the heartbeat sweep alone). The rollout
# gate task's decisions are in the rollout's history and the audit log, not in these lines.
ROUTINE_TASKS = (
    "nodes.check_host_heartbeats",
    "nodes-host-heartbeat-sweep",
    "nodes.evaluate_scaling",
    "nodes-scaling-evaluate",
    "routing.evaluate_rollouts",
    "routing-rollout-gates",
    "alerts.evaluate",
    "alerts-evaluate",
    "alerts.deliver_notifications",
    "routing.rollup_history",
    "routing.refresh_fleet_metrics",
    "routing-history-rollup",
    "routing.aggregate_history",
    "routing-history-aggregate",
    "routing.aggregate_history_hours",
    "routing-history-aggregate-hours",
    "routing.sleep_idle_engines",
    "routing-sleep-idle-engines",
)


class RoutineTaskFilter(logging.Filter):
    """Drops Celery's per-run INFO lines about routine tasks unless the root logger is at DEBUG.

    Attached to the loggers that write them (celery.beat, celery.worker.strategy, celery.app.trace).
    A routine task that fails is still logged: only INFO records are dropped.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or logging.getLogger().isEnabledFor(logging.DEBUG):
            return True
        message = record.getMessage()
        return not any(name in message for name in ROUTINE_TASKS)
