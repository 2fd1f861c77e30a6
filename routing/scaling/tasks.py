"""Beat tasks of a pool's capacity policies: the autoscaler's evaluation and the idle-sleep check.

Celery discovers only `<app>.tasks`: routing/tasks.py imports this module, so the tasks are registered
wherever routing's are. The autoscaler's task names predate the move from the nodes app; they are kept,
so that the beat schedule (inferchain/settings.py), the log filter (core/logs.py) and messages already
queued still match.
"""

from __future__ import annotations

from core.celery import app
from routing.scaling import autoscaler
from routing.scaling.sleep import sleep_idle_engines


@app.task(name="nodes.evaluate_scaling")
def evaluate_scaling() -> list[int]:
    """Evaluate each enabled scaling policy whose interval has passed (beat runs it every 2 s)."""
    return autoscaler.evaluate_due()


@app.task(name="nodes.evaluate_scaling_policy")
def evaluate_scaling_policy(policy_id: int) -> int | None:
    """One policy's evaluation now (idempotent: once per policy and interval)."""
    decision = autoscaler.evaluate(policy_id)
    return decision.pk if decision is not None else None


@app.task(name="routing.sleep_idle_engines")
def sleep_idle_engines_task() -> list[int]:
    """Every SLEEP_CHECK_INTERVAL_SECONDS: ask agents to put engines idle past their pool's or their own
    threshold to sleep (routing/scaling/sleep.py). Returns the deployment ids asked."""
    return sleep_idle_engines()
