"""What the gate task measures and decides for one rollout, from the request log and quality scores.

`measure` reads the figures of the current step's window (since `step_started_at`): for the candidate
and the baseline version, on the same alias and in the same window, the request count, the error rate,
p95 latency and p95 TTFT; and the candidate's quality, from shadow pairs when there are any since the
rollout started, else from the signed-off offline evaluation. `decide` turns figures and thresholds into
one verdict and is pure, so every rule below is tested without a database:

- the candidate has no ready deployment: roll back (nothing can serve its share);
- a gate could not be measured more than its `consecutive_error_limit` times in a row: roll back;
- a configured gate failed more than its `failure_limit` times in the step (default 0: the first
  failure), judged once the step has `min_step_requests` candidate requests: roll back; a failure
  within the limit holds;
- the step is younger than `min_step_seconds`: keep (no record, this is the normal wait);
- a gate could not be measured (within its limit): hold;
- too few candidate requests, or a configured gate has no figure yet: hold;
- a statistical or shadow gate is Inconclusive more than its `inconclusive_limit` times: pause for a
  person; within the limit (or with none): hold, saying so (a human resumes, promotes or rolls back, or
  the next evaluation has more data);
- all gates pass: advance, and from the last step below 100, promote; at a step the plan marks for
  approval, wait for an admin instead.

Dry-run gates are measured, counted and shown like the others and never enter these rules. Every gate's
outcome is one of Argo's four (Successful, Failed, Inconclusive, Error); the counting is in
routing/rollouts/analysis.py.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from django.db.models import Avg, Count, FloatField, Q, QuerySet
from django.db.models.fields.json import KT
from django.db.models.functions import Cast

from routing.models import RequestLog, Rollout, ShadowPair
from routing.rollouts import judge as stat
from routing.rollouts.analysis import (
    ERROR,
    FAILED,
    INCONCLUSIVE,
    SUCCESSFUL,
    MetricCounts,
    counts_state,
    step_counts,
)
from routing.rollouts.plans import GATES, GATES_BY_KEY, MetricOptions, metric_options
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
    # The step's shadow pairs (candidate against the baseline as primary), when a shadow gate is set.
    shadow: dict[str, Any] = field(default_factory=dict)
    # What could not be measured this time, by source ("traffic", "samples", "quality", "shadow"): the
    # error in words. Gates that need it are Error (counted against their consecutive-error limit).
    errors: dict[str, str] = field(default_factory=dict)

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
            "shadow": self.shadow,
            "errors": self.errors,
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


def shadow_figures(rollout: Rollout, since: dt.datetime, until: dt.datetime) -> dict[str, Any]:
    """The step's shadow pairs of the candidate against the baseline as the primary (a pair whose primary
    was the candidate itself, drawn by the canary, compares it with itself and is left out): how many,
    how many the candidate failed, exact-match rate and mean chrF over the scored ones, flips over the
    graded ones (a known answer: `reference_correct` set), mean KL over those that have one."""
    pairs = ShadowPair.objects.filter(
        alias=rollout.alias.name,
        candidate_version_id=rollout.candidate_version_id,
        primary_version_id=rollout.baseline_version_id,
        created_at__gte=since,
        created_at__lt=until,
    )
    scored = Q(chrf__isnull=False)
    graded = scored & Q(scores__reference_correct__in=[True, False])
    kl = Cast(KT("scores__mean_kl"), FloatField())
    agg = pairs.aggregate(
        pairs=Count("id"),
        scored=Count("id", filter=scored),
        exact=Count("id", filter=scored & Q(exact_match=True)),
        mean_chrf=Avg("chrf", filter=scored),
        graded=Count("id", filter=graded),
        flips=Count("id", filter=graded & Q(scores__flip__in=["right_to_wrong", "wrong_to_right"])),
        kl_pairs=Count(kl, filter=scored),
        mean_kl=Avg(kl, filter=scored),
    )
    n, g = agg["scored"], agg["graded"]
    return {
        "pairs": agg["pairs"],
        "failed": agg["pairs"] - n,
        "scored": n,
        "exact_match_rate": agg["exact"] / n if n else None,
        "chrf": agg["mean_chrf"],
        "graded": g,
        "flips": agg["flips"],
        "flip_rate": agg["flips"] / g if g else None,
        "kl_pairs": agg["kl_pairs"],
        "kl": agg["mean_kl"],
    }


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


def _error_text(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def measure(rollout: Rollout, now: dt.datetime, candidate_ready: int) -> Figures:
    """The step's figures; a part whose query raises is recorded in `errors` (its gates are Error) and
    the others are still measured."""
    alias = rollout.alias.name
    since = rollout.step_started_at
    figures = Figures(
        since=since,
        until=now,
        candidate=SideFigures(rollout.candidate_version_id),
        baseline=SideFigures(rollout.baseline_version_id),
        candidate_ready=candidate_ready,
    )
    try:
        figures.candidate = side_figures(alias, rollout.candidate_version_id, since, now)
        figures.baseline = side_figures(alias, rollout.baseline_version_id, since, now)
    except Exception as exc:
        figures.errors["traffic"] = _error_text(exc)
    columns = sorted({STAT_COLUMNS[k] for k in (rollout.gates or {}) if k in STAT_COLUMNS})
    if columns:
        try:
            figures.samples = {
                "candidate": side_samples(alias, rollout.candidate_version_id, since, now, columns),
                "baseline": side_samples(alias, rollout.baseline_version_id, since, now, columns),
            }
        except Exception as exc:
            figures.errors["samples"] = _error_text(exc)
    if _wants(rollout.gates, "quality"):
        try:
            figures.quality = quality_figures(rollout)
        except Exception as exc:
            figures.errors["quality"] = _error_text(exc)
    if _wants(rollout.gates, "shadow"):
        try:
            figures.shadow = shadow_figures(rollout, since, now)
        except Exception as exc:
            figures.errors["shadow"] = _error_text(exc)
    return figures


def _wants(gates: dict[str, Any], source: str) -> bool:
    return any(GATES_BY_KEY[k].source == source for k in gates if k in GATES_BY_KEY)


def _needs(key: str) -> str:
    """Which part of the figures a gate's value comes from (see `Figures.errors`)."""
    source = GATES_BY_KEY[key].source
    if source == "statistical":
        return "samples" if key in STAT_COLUMNS else "traffic"
    return source


# -- the verdict ------------------------------------------------------------------------------------------


@dataclass
class GateResult:
    value: float | None
    threshold: float
    passed: bool | None  # None: no figure to judge yet, Inconclusive, or not measured (Error)
    detail: str = ""
    # Successful, Failed, Inconclusive or Error; statistical gates add the judgement's numbers.
    outcome: str = ""
    judgement: dict[str, Any] | None = None
    dry_run: bool = False  # measured and shown, never deciding
    # The step's measurements so far, this one included (routing/rollouts/analysis.py), and the limits.
    counts: dict[str, int] = field(default_factory=dict)
    limits: dict[str, int | None] = field(default_factory=dict)


def statistical_judgement(
    key: str, tolerance: float, figures: Figures, min_samples: int = stat.DEFAULT_MIN_SAMPLES
) -> stat.Judgement:
    """A statistical gate's judgement of the step's window (routing/rollouts/judge.py)."""
    if key == "error_rate_tolerance":
        c, b = figures.candidate, figures.baseline
        return stat.compare_rate(
            c.errors, c.requests, b.errors, b.requests, tolerance, min_samples=min_samples
        )
    column = STAT_COLUMNS[key]
    return stat.compare_shift(
        figures.samples.get("candidate", {}).get(column, []),
        figures.samples.get("baseline", {}).get(column, []),
        tolerance,
        min_samples=min_samples,
    )


# A shadow gate's figure, the count it is over, and that count's name.
SHADOW_FIGURES = {
    "shadow_min_exact_match_rate": ("exact_match_rate", "scored", "scored pairs"),
    "shadow_min_chrf": ("chrf", "scored", "scored pairs"),
    "shadow_max_flip_rate": ("flip_rate", "graded", "graded pairs"),
    "shadow_max_kl": ("kl", "kl_pairs", "pairs with a KL"),
}


def shadow_result(key: str, threshold: float, figures: Figures, min_samples: int) -> GateResult:
    """A shadow gate against its threshold; Inconclusive below `min_samples` pairs that have the figure."""
    figure, count, label = SHADOW_FIGURES[key]
    n = int(figures.shadow.get(count) or 0)
    value = figures.shadow.get(figure)
    failed = figures.shadow.get("failed", 0)
    if n < min_samples or value is None:
        detail = (
            f"Inconclusive: {n} {label} in the step, {min_samples} needed ({failed} failed on the candidate)"
        )
        return GateResult(None if value is None else float(value), threshold, None, detail, INCONCLUSIVE)
    value = float(value)
    ok = value <= threshold if GATES_BY_KEY[key].bound == "max" else value >= threshold
    outcome = SUCCESSFUL if ok else FAILED
    detail = f"{outcome}: {value:.4g} over {n} {label} ({failed} failed on the candidate)"
    return GateResult(value, threshold, ok, detail, outcome)


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


def _one_gate(
    key: str, threshold: float, figures: Figures, options: MetricOptions, *, enough: bool
) -> GateResult:
    spec = GATES_BY_KEY[key]
    if spec.source == "statistical":
        j = statistical_judgement(key, threshold, figures, options.min_samples)
        passed = {stat.SUCCESSFUL: True, stat.FAILED: False}.get(j.outcome)
        return GateResult(j.estimate, threshold, passed, j.explain(), j.outcome, j.as_dict())
    if spec.source == "shadow":
        return shadow_result(key, threshold, figures, options.min_samples)
    value, detail = gate_value(key, figures)
    if value is None:
        return GateResult(None, threshold, None, detail, INCONCLUSIVE)
    ok = value <= threshold if spec.bound == "max" else value >= threshold
    # Traffic gates wait for the step's minimum sample before they may fail; quality figures come
    # from their own sample (shadow pairs, an offline run) and count at once.
    passed = ok if (ok or enough or spec.source == "quality") else None
    outcome = SUCCESSFUL if passed else FAILED if passed is False else INCONCLUSIVE
    return GateResult(value, threshold, passed, detail, outcome)


def judge(
    gates: dict[str, Any], figures: Figures, *, enough: bool, analysis: dict[str, Any] | None = None
) -> dict[str, GateResult]:
    """Each configured gate's value against its threshold; a figure fails only once `enough` data came.

    A gate whose figures could not be read, or whose judgement raised, is Error with the error in words.
    """
    out: dict[str, GateResult] = {}
    for spec in GATES:
        if gates.get(spec.key) is None:
            continue
        threshold = float(gates[spec.key])
        options = metric_options(analysis, spec.key)
        error = figures.errors.get(_needs(spec.key))
        if error is None:
            try:
                result = _one_gate(spec.key, threshold, figures, options, enough=enough)
            except Exception as exc:
                error = _error_text(exc)
        if error is not None:
            result = GateResult(None, threshold, None, f"Error: not measured ({error})", ERROR)
        result.dry_run = options.dry_run
        result.limits = {
            "failure_limit": options.failure_limit,
            "inconclusive_limit": options.inconclusive_limit,
            "consecutive_error_limit": options.consecutive_error_limit,
            "min_samples": options.min_samples,
        }
        out[spec.key] = result
    return out


class Verdict:
    ROLLBACK = "rollback"
    ADVANCE = "advance"
    PROMOTE = "promote"
    HOLD = "hold"
    PAUSE = "pause"  # an Inconclusive gate went past its limit: a person decides
    AWAIT_APPROVAL = "await_approval"  # the step passed and the plan wants an admin's approval
    KEEP = "keep"  # not yet time to decide; nothing is recorded


@dataclass
class Decision:
    verdict: str
    reason: str
    gates: dict[str, GateResult]
    figures: Figures
    # The step's measurement counts after this evaluation, as stored on the rollout.
    analysis_state: dict[str, Any] = field(default_factory=dict)

    def numbers(self, rollout: Rollout) -> dict[str, Any]:
        return {
            **self.figures.as_dict(),
            "gates": {k: asdict(v) for k, v in self.gates.items()},
            "minimums": {
                "seconds": rollout.min_step_seconds,
                "requests": rollout.min_step_requests,
            },
            "step": {
                "index": rollout.step_index,
                "share": rollout.share,
                "steps": rollout.steps,
                "approval": rollout.share in (rollout.approval_steps or []),
            },
        }


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def _needs_text(spec_key: str, g: GateResult) -> str:
    sign = "<=" if GATES_BY_KEY[spec_key].bound == "max" else ">="
    return f"{spec_key} = {_fmt(g.value)} (needs {sign} {g.threshold:g}; {g.detail}"


def _beyond(count: int, limit: int | None) -> bool:
    """More than `limit` (None: no limit)."""
    return limit is not None and count > limit


def _count(rollout: Rollout, gates: dict[str, GateResult], *, judged: bool) -> dict[str, Any]:
    """Add this evaluation's outcomes to the step's counts; copy them into each gate's result."""
    counts = step_counts(rollout)
    for key, g in gates.items():
        c = counts.setdefault(key, MetricCounts())
        c.add(g.outcome, judged=judged)
        g.counts = asdict(c)
    latest = {k: {"outcome": g.outcome, "value": g.value, "detail": g.detail} for k, g in gates.items()}
    return counts_state(rollout.step_index, counts, latest)


def decide(rollout: Rollout, figures: Figures) -> Decision:
    """The gate task's verdict for a running (or holding) rollout; see the module docstring for the rules."""
    enough_requests = figures.candidate.requests >= rollout.min_step_requests
    young = figures.seconds < rollout.min_step_seconds
    gates = judge(rollout.gates or {}, figures, enough=enough_requests, analysis=rollout.analysis)
    state = _count(rollout, gates, judged=enough_requests and not young)

    def verdict(kind: str, reason: str) -> Decision:
        return Decision(kind, reason, gates, figures, state)

    if figures.candidate_ready == 0:
        return verdict(
            Verdict.ROLLBACK,
            f"Candidate {rollout.candidate_version} has no ready deployment serving '{rollout.alias.name}' "
            "(all died or were stopped).",
        )
    deciding = {k: g for k, g in gates.items() if not g.dry_run}
    limit = {k: metric_options(rollout.analysis, k) for k in gates}
    broken = [
        k for k, g in deciding.items() if g.counts["consecutive_errors"] > limit[k].consecutive_error_limit
    ]
    if broken:
        parts = [
            f"{k} could not be measured {deciding[k].counts['consecutive_errors']} times in a row "
            f"(limit {limit[k].consecutive_error_limit}; {deciding[k].detail})"
            for k in broken
        ]
        return verdict(Verdict.ROLLBACK, "Analysis error: " + "; ".join(parts) + ".")
    failed = [k for k, g in deciding.items() if g.passed is False]
    beyond = [k for k in failed if deciding[k].counts["failed"] > limit[k].failure_limit]
    if beyond:
        parts = []
        for k in beyond:
            g = deciding[k]
            tail = (
                f"; failed {g.counts['failed']} measurements, limit {limit[k].failure_limit})"
                if limit[k].failure_limit
                else ")"
            )
            parts.append(_needs_text(k, g) + tail)
        return verdict(Verdict.ROLLBACK, "Gate failed: " + "; ".join(parts) + ".")
    if failed:
        parts = [
            f"{_needs_text(k, deciding[k])}); failed {deciding[k].counts['failed']} of the "
            f"{limit[k].failure_limit} measurements allowed"
            for k in failed
        ]
        return verdict(
            Verdict.HOLD, f"Failed within its limit, holding at {rollout.share:g}%: " + "; ".join(parts) + "."
        )
    if young:
        return verdict(
            Verdict.KEEP,
            f"Step at {rollout.share:g}% for {figures.seconds:.0f} s of {rollout.min_step_seconds} s.",
        )
    errored = [k for k, g in deciding.items() if g.outcome == ERROR]
    if errored:
        parts = [
            f"{k} ({deciding[k].counts['consecutive_errors']} in a row, limit "
            f"{limit[k].consecutive_error_limit}; {deciding[k].detail})"
            for k in errored
        ]
        return verdict(
            Verdict.HOLD, f"Measurement error, holding at {rollout.share:g}%: " + "; ".join(parts) + "."
        )
    if not enough_requests:
        return verdict(
            Verdict.HOLD,
            f"Not enough data: {figures.candidate.requests} candidate requests in the step, "
            f"{rollout.min_step_requests} needed.",
        )
    undecided = [k for k, g in deciding.items() if g.passed is None]
    too_many = [
        k for k in undecided if _beyond(deciding[k].counts["inconclusive"], limit[k].inconclusive_limit)
    ]
    if too_many:
        details = "; ".join(
            f"{k} Inconclusive {deciding[k].counts['inconclusive']} times, "
            f"limit {limit[k].inconclusive_limit} ({deciding[k].detail})"
            for k in too_many
        )
        return verdict(
            Verdict.PAUSE,
            f"Inconclusive beyond its limit, paused at {rollout.share:g}% for a person (resume to measure "
            f"the step again, promote or roll back): {details}.",
        )
    # Statistical and shadow gates judge their own sample; the others only lack a figure yet.
    inconclusive = [k for k in undecided if GATES_BY_KEY[k].source in ("statistical", "shadow")]
    if inconclusive:
        details = "; ".join(f"{k}: {gates[k].detail}" for k in inconclusive)
        return verdict(
            Verdict.HOLD,
            f"Inconclusive, holding at {rollout.share:g}% (more traffic may decide it; or resume, promote "
            f"or roll back by hand): {details}.",
        )
    if undecided:
        details = "; ".join(f"{k}: {gates[k].detail}" for k in undecided)
        return verdict(Verdict.HOLD, f"Not enough data for {details}.")
    summary = ", ".join(f"{k} = {_fmt(g.value)}" for k, g in deciding.items()) or (
        "no deciding gates" if gates else "no gates configured"
    )
    dry = [f"{k} {g.outcome} = {_fmt(g.value)}" for k, g in gates.items() if g.dry_run]
    if dry:
        summary += "; dry run, not deciding: " + ", ".join(dry)
    steps = rollout.steps
    last = rollout.step_index + 1 >= len(steps) - 1
    if rollout.share in (rollout.approval_steps or []):
        then = "promote" if last else f"go on to {steps[rollout.step_index + 1]:g}%"
        return verdict(
            Verdict.AWAIT_APPROVAL,
            f"All gates passed at {rollout.share:g}% ({summary}); waiting for an admin's approval to {then}.",
        )
    if last:
        return verdict(Verdict.PROMOTE, f"All gates passed at {rollout.share:g}% ({summary}).")
    return verdict(
        Verdict.ADVANCE,
        f"All gates passed at {rollout.share:g}% ({summary}); on to {steps[rollout.step_index + 1]:g}%.",
    )
