"""A rollout's plan checked before anything is saved: its steps and its gates.

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
    # request log's samples compared statistically (routing/rollouts/judge.py: the threshold is a tolerance).
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
