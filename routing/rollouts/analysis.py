"""Each step's analysis: what one gate's measurements add up to, and the per-step view the console shows.

Argo Rollouts runs an AnalysisRun per step: every measurement of a metric is Successful, Failed,
Inconclusive or Error, and the run is Failed once a metric has more Failed measurements than its
`failureLimit`, Inconclusive (the rollout pauses for a person) once it has more Inconclusive ones than
its `inconclusiveLimit`, and Error once its query failed more than `consecutiveErrorLimit` times in a
row; a `dryRun` metric is measured and shown but never decides. Here a measurement is one gate-task
evaluation of the step (every `ROLLOUT_GATE_INTERVAL_SECONDS`), so the limits debounce: with
`failure_limit` 2 a failure must be seen in three evaluations of the step before it rolls back.

The counts live on the rollout (`analysis_state`: the step they belong to and, per gate, the outcome
counts), start afresh when the step changes or a person resumes, and are copied into every decision's
`numbers` (`gates.<key>.counts`), so each step's decision keeps the numbers it was made on.

Until the step has its minimums (`min_step_seconds`, `min_step_requests`) only Failed and Error
outcomes count: waiting for the step's own minimum sample is not a gate's indecision.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from routing.models import Rollout, RolloutDecision
from routing.rollouts.plans import GATES, GATES_BY_KEY, metric_options

ORDER = {g.key: i for i, g in enumerate(GATES)}

SUCCESSFUL = "Successful"
FAILED = "Failed"
INCONCLUSIVE = "Inconclusive"
ERROR = "Error"


@dataclass
class MetricCounts:
    """One gate's measurements in the current step, by outcome."""

    measurements: int = 0
    successful: int = 0
    failed: int = 0
    inconclusive: int = 0
    errors: int = 0
    consecutive_errors: int = 0

    def add(self, outcome: str, *, judged: bool) -> None:
        """Count one evaluation's outcome (`judged`: the step has its minimums, so every outcome counts)."""
        if outcome == ERROR:
            self.measurements += 1
            self.errors += 1
            self.consecutive_errors += 1
            return
        if outcome == FAILED:
            self.measurements += 1
            self.failed += 1
        elif judged and outcome == SUCCESSFUL:
            self.measurements += 1
            self.successful += 1
        elif judged and outcome == INCONCLUSIVE:
            self.measurements += 1
            self.inconclusive += 1
        self.consecutive_errors = 0


def step_counts(rollout: Rollout) -> dict[str, MetricCounts]:
    """The current step's counts so far (empty when the stored ones belong to another step)."""
    state = rollout.analysis_state or {}
    if state.get("step") != rollout.step_index:
        return {}
    return {k: MetricCounts(**v) for k, v in (state.get("metrics") or {}).items()}


def counts_state(
    step: int, counts: dict[str, MetricCounts], latest: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """What `analysis_state` stores: the step, each gate's counts and its latest outcome, value and detail."""
    return {"step": step, "metrics": {k: asdict(v) for k, v in counts.items()}, "latest": latest or {}}


# -- the console's view: one row per step of the plan -----------------------------------------------------


def _metric_row(key: str, gate: dict[str, Any], analysis: dict[str, Any]) -> dict[str, Any]:
    spec = GATES_BY_KEY.get(key)
    options = metric_options(analysis, key)
    limits = gate.get("limits") or {}
    return {
        "key": key,
        "title": spec.label if spec else key,
        "bound": spec.bound if spec else "max",
        "outcome": gate.get("outcome") or "",
        "value": gate.get("value"),
        "threshold": gate.get("threshold"),
        "detail": gate.get("detail") or "",
        "dry_run": bool(gate.get("dry_run", options.dry_run)),
        "counts": {**asdict(MetricCounts()), **(gate.get("counts") or {})},
        "failure_limit": limits.get("failure_limit", options.failure_limit),
        "inconclusive_limit": limits.get("inconclusive_limit", options.inconclusive_limit),
        "consecutive_error_limit": limits.get("consecutive_error_limit", options.consecutive_error_limit),
    }


def step_analyses(rollout: Rollout, decisions: list[RolloutDecision]) -> list[dict[str, Any]]:
    """Per step of the plan: its share, whether it waits for approval, where the rollout is with it, and
    its latest decision with the numbers it was made on (each gate's outcome, value, threshold, counts and
    limits). The current step shows its latest measurement and counts so far (the gate task measures it
    every tick, most of which record no decision)."""
    by_step: dict[int, RolloutDecision] = {}
    for d in decisions:
        step = (d.numbers or {}).get("step") or {}
        if "index" in step and (d.numbers or {}).get("gates") is not None:
            by_step[int(step["index"])] = d  # decisions come oldest first: the latest wins
    # A person's approval or promotion carries no numbers; it is the step's decision all the same.
    latest_action: dict[int, RolloutDecision] = {}
    for d in decisions:
        index = ((d.numbers or {}).get("step") or {}).get("index")
        if index is not None:
            latest_action[int(index)] = d
    approvals = {float(s) for s in rollout.approval_steps or []}
    counts = step_counts(rollout)
    rows = []
    for index, share in enumerate(rollout.steps):
        if rollout.state == "promoted" or index < rollout.step_index:
            status = "done"
        elif index == rollout.step_index and rollout.active:
            status = "current"
        elif index == rollout.step_index and rollout.state == "rolled_back":
            status = "stopped"
        else:
            status = "pending"
        decision = by_step.get(index)
        last = latest_action.get(index, decision)
        gates = ((decision.numbers or {}).get("gates") or {}) if decision else {}
        metrics = [_metric_row(k, g, rollout.analysis) for k, g in gates.items()]
        if status == "current" and counts:  # the live counts are newer than any decision of the step
            latest = (rollout.analysis_state or {}).get("latest") or {}
            metrics = [
                _metric_row(
                    k,
                    {**latest.get(k, {}), "counts": asdict(c), "threshold": rollout.gates.get(k)},
                    rollout.analysis,
                )
                for k, c in counts.items()
            ]
        # In the plan's gate order (a jsonb object keeps no key order).
        metrics.sort(key=lambda m: ORDER.get(m["key"], len(ORDER)))
        rows.append(
            {
                "index": index,
                "share": float(share),
                "approval": float(share) in approvals,
                "status": status,
                "decision": None
                if last is None
                else {
                    "action": last.action,
                    "created_at": last.created_at,
                    "reason": last.reason,
                    "actor_name": last.actor.get_username() if last.actor else "gate task",
                },
                "candidate_requests": ((decision.numbers or {}).get("candidate") or {}).get("requests")
                if decision
                else None,
                "baseline_requests": ((decision.numbers or {}).get("baseline") or {}).get("requests")
                if decision
                else None,
                "metrics": metrics,
            }
        )
    return rows
