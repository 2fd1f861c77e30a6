"""What the gate task measures and decides for one rollout, from the request log and quality scores.

`measure` reads the figures of the current step's window (since `step_started_at`): for the candidate
and the baseline version, on the same alias and in the same window, the request count, the error rate,
p95 latency and p95 TTFT; and the candidate's quality, from shadow pairs when there are any since the
rollout started, else from the signed-off offline evaluation. `decide` turns figures and thresholds into
one verdict and is pure, so every rule below is tested without a database:

- the candidate has no ready deployment: roll back (nothing can serve its share);
- a configured gate failed, judged once the step has `min_step_requests` candidate requests: roll back;
- the step is younger than `min_step_seconds`: keep (no record, this is the normal wait);
- too few candidate requests, or a configured gate has no figure yet: hold;
- a statistical gate (routing/rollouts/judge.py) is Inconclusive: hold, saying so (a human resumes,
  promotes or rolls back, or the next evaluation has more data);
- all gates pass: advance, and from the last step below 100, promote.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from django.db.models import Avg, Count, Q, QuerySet

from routing.models import RequestLog, Rollout, ShadowPair
from routing.rollouts import judge as stat
from routing.rollouts.plans import GATES, GATES_BY_KEY
from routing.rollouts.signoff import accepted_evaluation, offline_quality

# Errors the candidate is blamed for: server-side statuses and upstream failures. A 4xx is the client's
# request (bad input, quota, disconnect), the same whichever version would have answered it.
UPSTREAM_ERRORS = ("upstream_timeout", "upstream_disconnected")
ERROR_Q = Q(status__gte=500) | Q(error_type__in=UPSTREAM_ERRORS)


@dataclass
class SideFigures:
    """One version's traffic in the window."""

    version_id: int
    requests: int = 0
    errors: int = 0
    error_rate: float | None = None
    p95_latency_ms: float | None = None
    p95_ttft_ms: float | None = None


@dataclass
class Figures:
    """Everything one evaluation looked at, as stored in a decision's `numbers`."""

    since: dt.datetime
    until: dt.datetime
    candidate: SideFigures
    baseline: SideFigures
    quality: dict[str, Any] = field(default_factory=dict)
    candidate_ready: int = 0  # ready deployments of the candidate serving the alias
    # The answered requests' latency and TTFT per side ("candidate"/"baseline" -> column -> values), read
    # only when a statistical gate needs them; judged, not stored (a decision keeps the judgement).
    samples: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return (self.until - self.since).total_seconds()

    def as_dict(self) -> dict[str, Any]:
        return {
            "window": {
                "since": self.since.isoformat(),
                "until": self.until.isoformat(),
                "seconds": round(self.seconds, 3),
            },
            "candidate": asdict(self.candidate),
            "baseline": asdict(self.baseline),
            "quality": self.quality,
            "candidate_ready_deployments": self.candidate_ready,
        }


def percentile(rows: QuerySet[RequestLog], column: str, q: float = 0.95) -> float | None:
    """The nearest-rank percentile of a column over the rows that have it (one ordered query, any DB)."""
    values = rows.exclude(**{f"{column}__isnull": True})
    n = values.count()
    if n == 0:
        return None
    rank = max(1, math.ceil(q * n))
    return float(values.order_by(column).values_list(column, flat=True)[rank - 1])


def side_figures(alias: str, version_id: int, since: dt.datetime, until: dt.datetime) -> SideFigures:
    rows = RequestLog.objects.filter(
        alias=alias, model_version_id=version_id, created_at__gte=since, created_at__lt=until
    )
    counts = rows.aggregate(requests=Count("id"), errors=Count("id", filter=ERROR_Q))
    n = counts["requests"]
    return SideFigures(
        version_id=version_id,
        requests=n,
        errors=counts["errors"],
        error_rate=counts["errors"] / n if n else None,
        # Latency and TTFT of the answers only: a refused or failed request's time says nothing of speed.
        p95_latency_ms=percentile(rows.filter(status=200), "latency_ms"),
        p95_ttft_ms=percentile(rows.filter(status=200), "ttft_ms"),
    )


def quality_figures(rollout: Rollout) -> dict[str, Any]:
    """The candidate's quality: shadow pairs since the rollout started, else the signed-off offline run."""
    pairs = ShadowPair.objects.filter(
        alias=rollout.alias.name,
        candidate_version_id=rollout.candidate_version_id,
        created_at__gte=rollout.created_at,
    ).exclude(chrf__isnull=True)
    agg = pairs.aggregate(n=Count("id"), chrf=Avg("chrf"), exact=Count("id", filter=Q(exact_match=True)))
    if agg["n"]:
        # score_sample's dict: a case's answer is known when reference_correct is set; flip names a change.
        known_answer = pairs.filter(scores__reference_correct__in=[True, False])
        known = known_answer.count()
        flipped = known_answer.filter(scores__flip__in=["right_to_wrong", "wrong_to_right"]).count()
        return {
            "source": "shadow",
            "samples": agg["n"],
            "chrf": agg["chrf"],
            "exact_match_rate": agg["exact"] / agg["n"],
            "flip_rate": flipped / known if known else None,
            "kl": None,
        }
    run = accepted_evaluation(rollout.candidate_version_id)
    if run is not None:
        return {"source": "offline", **offline_quality(run)}
    return {"source": None, "samples": 0}


STAT_COLUMNS = {"ttft_tolerance": "ttft_ms", "latency_tolerance": "latency_ms"}


def side_samples(
    alias: str, version_id: int, since: dt.datetime, until: dt.datetime, columns: list[str]
) -> dict[str, list[float]]:
    """The answered requests' values of `columns` in the window (one query), None values left out."""
    rows = RequestLog.objects.filter(
        alias=alias, model_version_id=version_id, created_at__gte=since, created_at__lt=until, status=200
    ).values_list(*columns)
    out: dict[str, list[float]] = {c: [] for c in columns}
    for row in rows:
        for column, value in zip(columns, row, strict=True):
            if value is not None:
                out[column].append(float(value))
    return out


def measure(rollout: Rollout, now: dt.datetime, candidate_ready: int) -> Figures:
    alias = rollout.alias.name
    since = rollout.step_started_at
    columns = sorted({STAT_COLUMNS[k] for k in (rollout.gates or {}) if k in STAT_COLUMNS})
    samples = {}
    if columns:
        samples = {
            "candidate": side_samples(alias, rollout.candidate_version_id, since, now, columns),
            "baseline": side_samples(alias, rollout.baseline_version_id, since, now, columns),
        }
    return Figures(
        since=since,
        until=now,
        candidate=side_figures(alias, rollout.candidate_version_id, since, now),
        baseline=side_figures(alias, rollout.baseline_version_id, since, now),
        quality=quality_figures(rollout) if _wants_quality(rollout.gates) else {},
        candidate_ready=candidate_ready,
        samples=samples,
    )


def _wants_quality(gates: dict[str, Any]) -> bool:
    return any(GATES_BY_KEY[k].source == "quality" for k in gates if k in GATES_BY_KEY)


# -- the verdict ------------------------------------------------------------------------------------------


@dataclass
class GateResult:
    value: float | None
    threshold: float
    passed: bool | None  # None: no figure to judge yet, or a statistical gate is Inconclusive
    detail: str = ""
    # Statistical gates: Successful, Failed or Inconclusive, and the judgement's numbers.
    outcome: str = ""
    judgement: dict[str, Any] | None = None


def statistical_judgement(key: str, tolerance: float, figures: Figures) -> stat.Judgement:
    """A statistical gate's judgement of the step's window (routing/rollouts/judge.py)."""
    if key == "error_rate_tolerance":
        c, b = figures.candidate, figures.baseline
        return stat.compare_rate(c.errors, c.requests, b.errors, b.requests, tolerance)
    column = STAT_COLUMNS[key]
    return stat.compare_shift(
        figures.samples.get("candidate", {}).get(column, []),
        figures.samples.get("baseline", {}).get(column, []),
        tolerance,
    )


def _ratio(candidate: float | None, baseline: float | None) -> float | None:
    if candidate is None or baseline is None or baseline <= 0:
        return None
    return candidate / baseline


def gate_value(key: str, figures: Figures) -> tuple[float | None, str]:
    """A gate's value from the figures, and how it was made (shown with the number)."""
    c, b, quality = figures.candidate, figures.baseline, figures.quality
    if key == "max_error_rate_delta":
        if c.error_rate is None or b.error_rate is None:
            return None, "needs requests on both versions"
        return c.error_rate - b.error_rate, (
            f"candidate {c.errors}/{c.requests} = {c.error_rate:.2%}, "
            f"baseline {b.errors}/{b.requests} = {b.error_rate:.2%}"
        )
    if key in ("max_p95_latency_ratio", "max_ttft_p95_ratio"):
        name = "p95_latency_ms" if key == "max_p95_latency_ratio" else "p95_ttft_ms"
        cv, bv = getattr(c, name), getattr(b, name)
        value = _ratio(cv, bv)
        if value is None:
            return None, f"needs {name} on both versions"
        return value, f"candidate {cv:.0f} ms, baseline {bv:.0f} ms"
    figure = {
        "max_flip_rate": "flip_rate",
        "min_chrf": "chrf",
        "min_exact_match_rate": "exact_match_rate",
    }.get(key, "kl")
    value = quality.get(figure)
    source = quality.get("source")
    if value is None:
        return None, f"no {figure} yet (shadow pairs or a signed-off evaluation)"
    return float(value), f"from {source} ({quality.get('samples')} samples)"


def judge(gates: dict[str, Any], figures: Figures, *, enough: bool) -> dict[str, GateResult]:
    """Each configured gate's value against its threshold; a figure fails only once `enough` data came."""
    out: dict[str, GateResult] = {}
    for spec in GATES:
        if gates.get(spec.key) is None:
            continue
        threshold = float(gates[spec.key])
        if spec.source == "statistical":
            j = statistical_judgement(spec.key, threshold, figures)
            passed = {stat.SUCCESSFUL: True, stat.FAILED: False}.get(j.outcome)
            out[spec.key] = GateResult(j.estimate, threshold, passed, j.explain(), j.outcome, j.as_dict())
            continue
        value, detail = gate_value(spec.key, figures)
        if value is None:
            passed = None
        else:
            ok = value <= threshold if spec.bound == "max" else value >= threshold
            # Traffic gates wait for the step's minimum sample before they may fail; quality figures come
            # from their own sample (shadow pairs, an offline run) and count at once.
            passed = ok if (ok or enough or spec.source == "quality") else None
        out[spec.key] = GateResult(value, threshold, passed, detail)
    return out


class Verdict:
    ROLLBACK = "rollback"
    ADVANCE = "advance"
    PROMOTE = "promote"
    HOLD = "hold"
    KEEP = "keep"  # not yet time to decide; nothing is recorded


@dataclass
class Decision:
    verdict: str
    reason: str
    gates: dict[str, GateResult]
    figures: Figures

    def numbers(self, rollout: Rollout) -> dict[str, Any]:
        return {
            **self.figures.as_dict(),
            "gates": {k: asdict(v) for k, v in self.gates.items()},
            "minimums": {
                "seconds": rollout.min_step_seconds,
                "requests": rollout.min_step_requests,
            },
            "step": {"index": rollout.step_index, "share": rollout.share, "steps": rollout.steps},
        }


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def decide(rollout: Rollout, figures: Figures) -> Decision:
    """The gate task's verdict for a running (or holding) rollout; see the module docstring for the rules."""
    enough_requests = figures.candidate.requests >= rollout.min_step_requests
    gates = judge(rollout.gates or {}, figures, enough=enough_requests)
    if figures.candidate_ready == 0:
        return Decision(
            Verdict.ROLLBACK,
            f"Candidate {rollout.candidate_version} has no ready deployment serving '{rollout.alias.name}' "
            "(all died or were stopped).",
            gates,
            figures,
        )
    failed = [k for k, g in gates.items() if g.passed is False]
    if failed:
        parts = []
        for k in failed:
            g = gates[k]
            sign = "<=" if GATES_BY_KEY[k].bound == "max" else ">="
            parts.append(f"{k} = {_fmt(g.value)} (needs {sign} {g.threshold:g}; {g.detail})")
        return Decision(Verdict.ROLLBACK, "Gate failed: " + "; ".join(parts) + ".", gates, figures)
    if figures.seconds < rollout.min_step_seconds:
        return Decision(
            Verdict.KEEP,
            f"Step at {rollout.share:g}% for {figures.seconds:.0f} s of {rollout.min_step_seconds} s.",
            gates,
            figures,
        )
    if not enough_requests:
        return Decision(
            Verdict.HOLD,
            f"Not enough data: {figures.candidate.requests} candidate requests in the step, "
            f"{rollout.min_step_requests} needed.",
            gates,
            figures,
        )
    inconclusive = [k for k, g in gates.items() if g.outcome == stat.INCONCLUSIVE]
    if inconclusive:
        details = "; ".join(f"{k}: {gates[k].detail}" for k in inconclusive)
        return Decision(
            Verdict.HOLD,
            f"Inconclusive, holding at {rollout.share:g}% (more traffic may decide it; or resume, promote "
            f"or roll back by hand): {details}.",
            gates,
            figures,
        )
    undecided = [k for k, g in gates.items() if g.passed is None]
    if undecided:
        details = "; ".join(f"{k}: {gates[k].detail}" for k in undecided)
        return Decision(Verdict.HOLD, f"Not enough data for {details}.", gates, figures)
    summary = ", ".join(f"{k} = {_fmt(g.value)}" for k, g in gates.items()) or "no gates configured"
    steps = rollout.steps
    if rollout.step_index + 1 >= len(steps) - 1:
        return Decision(
            Verdict.PROMOTE, f"All gates passed at {rollout.share:g}% ({summary}).", gates, figures
        )
    return Decision(
        Verdict.ADVANCE,
        f"All gates passed at {rollout.share:g}% ({summary}); on to {steps[rollout.step_index + 1]:g}%.",
        gates,
        figures,
    )
