"""A rollout's plan checked before anything is saved: its steps, its gates, the analysis's limits and
the steps that wait for an admin's approval.

Pure functions over plain values, so the API, the services and the tests share one set of rules and
one wording for each refusal (`PlanError` names the field it is about).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class PlanError(ValueError):
    """Bad input for a rollout or a shadow config; `field` is the API field it belongs to."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class GateSpec:
    """One gate: its key in `Rollout.gates`, what it compares, and which way is bad."""

    key: str
    label: str
    # "max": the value must stay at or below the threshold; "min": at or above it.
    bound: str
    # Where its value comes from: the request log (candidate against baseline), quality scores, or the
    # request log's samples compared statistically (routing/rollouts/judge.py: the threshold is a tolerance),
    # or the step's shadow pairs (routing/rollouts/analysis.py: Inconclusive below the minimum sample).
    source: str
    unit: str = ""
    upper_limit: float | None = None  # the largest threshold that makes sense (rates, chrF)


GATES: tuple[GateSpec, ...] = (
    GateSpec("max_error_rate_delta", "Error rate, candidate minus baseline", "max", "traffic", "", 1.0),
    GateSpec("max_p95_latency_ratio", "p95 latency, candidate / baseline", "max", "traffic", "x"),
    GateSpec("max_ttft_p95_ratio", "p95 TTFT, candidate / baseline", "max", "traffic", "x"),
    GateSpec("max_flip_rate", "Flip rate", "max", "quality", "", 1.0),
    GateSpec("min_chrf", "Mean chrF", "min", "quality", "", 100.0),
    GateSpec("min_exact_match_rate", "Exact-match rate", "min", "quality", "", 1.0),
    GateSpec("max_kl", "Mean KL divergence", "max", "quality", "nats"),
    GateSpec("ttft_tolerance", "TTFT shift vs baseline, Mann-Whitney", "max", "statistical", "", 10.0),
    GateSpec("latency_tolerance", "Latency shift vs baseline, Mann-Whitney", "max", "statistical", "", 10.0),
    GateSpec("error_rate_tolerance", "Error rate above baseline, 95% CI", "max", "statistical", "", 1.0),
    GateSpec("shadow_min_exact_match_rate", "Shadow pairs: exact-match rate", "min", "shadow", "", 1.0),
    GateSpec("shadow_min_chrf", "Shadow pairs: mean chrF", "min", "shadow", "", 100.0),
    GateSpec("shadow_max_flip_rate", "Shadow pairs: flip rate (graded cases)", "max", "shadow", "", 1.0),
    GateSpec("shadow_max_kl", "Shadow pairs: mean KL", "max", "shadow", "nats"),
)
GATES_BY_KEY = {g.key: g for g in GATES}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def validate_steps(steps: Any) -> list[float]:
    """Rising percentages within (0, 100], ending at 100, at least one below it; returns them as floats."""
    if not isinstance(steps, list) or not steps:
        raise PlanError("steps", "Give the steps as a list of percentages, e.g. [1, 5, 25, 50, 100].")
    if not all(_number(s) for s in steps):
        raise PlanError("steps", "Every step must be a number (a percentage of the alias's traffic).")
    values = [float(s) for s in steps]
    for i, value in enumerate(values):
        if not 0 < value <= 100:
            raise PlanError(
                "steps", f"Step {i + 1} is {value:g}%; every step must be above 0 and at most 100."
            )
    for i in range(1, len(values)):
        if values[i] <= values[i - 1]:
            raise PlanError(
                "steps",
                f"Steps must rise: step {i + 1} ({values[i]:g}%) is not above step {i} ({values[i - 1]:g}%).",
            )
    if values[-1] != 100:
        raise PlanError("steps", f"The last step must be 100 (the promotion); it is {values[-1]:g}.")
    if len(values) < 2:
        raise PlanError(
            "steps",
            "A plan needs at least one step below 100; to move all traffic at once, switch the alias.",
        )
    return values


def validate_gates(gates: Any) -> dict[str, float]:
    """Known gate keys with non-negative numeric thresholds (within the gate's range)."""
    if gates is None:
        return {}
    if not isinstance(gates, dict):
        raise PlanError("gates", 'Give the gates as an object, e.g. {"max_error_rate_delta": 0.02}.')
    unknown = sorted(set(gates) - set(GATES_BY_KEY))
    if unknown:
        raise PlanError("gates", f"Unknown gates {unknown}; known: {', '.join(GATES_BY_KEY)}.")
    out: dict[str, float] = {}
    for name, value in gates.items():
        if value is None:
            continue  # an explicit null is "no such gate", as an absent key
        spec = GATES_BY_KEY[name]
        if not _number(value) or value < 0:
            raise PlanError("gates", f"Gate '{name}' must be a number of at least 0.")
        if spec.upper_limit is not None and value > spec.upper_limit:
            raise PlanError("gates", f"Gate '{name}' must be at most {spec.upper_limit:g}.")
        if spec.key.endswith("_ratio") and value < 1:
            raise PlanError(
                "gates",
                f"Gate '{name}' is a ratio to the baseline; below 1 would fail an identical candidate.",
            )
        out[name] = float(value)
    return out


def validate_percent(value: Any, field: str = "percent") -> float:
    if not _number(value) or not 0 <= value <= 100:
        raise PlanError(field, "Must be a percentage from 0 to 100.")
    return float(value)


# -- the analysis: limits per gate, dry-run gates, approval steps -------------------------------------------


@dataclass(frozen=True)
class MetricOptions:
    """How one gate's measurements decide a step (Argo Rollouts' metric fields, same meaning).

    `failure_limit`: Failed measurements allowed in a step; one more rolls back (0: the first does).
    `inconclusive_limit`: Inconclusive measurements allowed; one more pauses for a person (None: no
    limit, hold until the data decides). `consecutive_error_limit`: measurements in a row that could not
    be made (the query raised); one more rolls back. `min_samples`: the values (requests a side, shadow
    pairs) below which a statistical or shadow gate is Inconclusive. `dry_run`: measured and shown,
    never deciding.
    """

    failure_limit: int = 0
    inconclusive_limit: int | None = None
    consecutive_error_limit: int = 4
    min_samples: int = 20
    dry_run: bool = False


LIMIT_FIELDS = ("failure_limit", "inconclusive_limit", "consecutive_error_limit", "min_samples")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_options(options: Any, where: str, *, allow_dry_run: bool) -> dict[str, Any]:
    if not isinstance(options, dict):
        raise PlanError("analysis", f'{where} must be an object, e.g. {{"failure_limit": 2}}.')
    known = (*LIMIT_FIELDS, "dry_run") if allow_dry_run else LIMIT_FIELDS
    unknown = sorted(set(options) - set(known) - ({"metrics"} if not allow_dry_run else set()))
    if unknown:
        raise PlanError("analysis", f"Unknown {where} fields {unknown}; known: {', '.join(known)}.")
    out: dict[str, Any] = {}
    for name in LIMIT_FIELDS:
        if name not in options:
            continue
        value = options[name]
        if value is None and name == "inconclusive_limit":
            out[name] = None  # explicitly no limit
            continue
        least = 1 if name == "min_samples" else 0
        if not _whole(value) or value < least or value > 1_000_000:
            raise PlanError("analysis", f"{where}.{name} must be a whole number from {least} to 1000000.")
        out[name] = value
    if allow_dry_run and "dry_run" in options:
        if not isinstance(options["dry_run"], bool):
            raise PlanError("analysis", f"{where}.dry_run must be true or false.")
        out["dry_run"] = options["dry_run"]
    return out


def validate_analysis(analysis: Any, gates: dict[str, float]) -> dict[str, Any]:
    """Limits for every gate (top level) and per gate (`metrics`: gate key -> limits and `dry_run`).

    Per-gate options name a gate the plan configures; a dry-run gate needs a threshold to be measured
    against. Returns the options as given (defaults are applied when read, by `metric_options`).
    """
    if analysis is None:
        return {}
    out = _check_options(analysis, "analysis", allow_dry_run=False)
    metrics = analysis.get("metrics") or {}
    if not isinstance(metrics, dict):
        raise PlanError("analysis", 'analysis.metrics must be an object: gate key -> {"dry_run": true, ...}.')
    checked: dict[str, Any] = {}
    for key, options in metrics.items():
        if key not in GATES_BY_KEY:
            raise PlanError(
                "analysis", f"analysis.metrics: unknown gate '{key}'; known: {', '.join(GATES_BY_KEY)}."
            )
        if gates.get(key) is None:
            raise PlanError(
                "analysis",
                f"analysis.metrics.{key}: the plan has no '{key}' gate; give it a threshold in gates.",
            )
        checked[key] = _check_options(options, f"analysis.metrics.{key}", allow_dry_run=True)
    if checked:
        out["metrics"] = checked
    return out


def metric_options(analysis: dict[str, Any] | None, key: str) -> MetricOptions:
    """One gate's options: its own, else the analysis's defaults, else MetricOptions' defaults."""
    analysis = analysis or {}
    own = (analysis.get("metrics") or {}).get(key) or {}
    values: dict[str, Any] = {}
    for name in (*LIMIT_FIELDS, "dry_run"):
        if name in own:
            values[name] = own[name]
        elif name in analysis and name != "dry_run":
            values[name] = analysis[name]
    return MetricOptions(**values)


def validate_approval_steps(value: Any, steps: list[float]) -> list[float]:
    """Percentages of the plan's steps below 100 after which an admin approves before the rollout goes on."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(_number(v) for v in value):
        raise PlanError(
            "approval_steps", "Give the approval steps as a list of the plan's percentages, e.g. [25]."
        )
    out = sorted({float(v) for v in value})
    for v in out:
        if v not in steps[:-1]:
            below = ", ".join(f"{s:g}" for s in steps[:-1])
            raise PlanError(
                "approval_steps", f"{v:g}% is not a step of the plan below 100; choose among {below}."
            )
    return out
