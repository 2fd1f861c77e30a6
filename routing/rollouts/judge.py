"""The statistical canary judge: is the candidate worse than the baseline by more than a tolerance?

A static threshold on a ratio of two p95s (`max_ttft_p95_ratio`) fails an identical candidate whenever the
two samples happen to differ, and passes a worse one while its sample is small. Kayenta (Netflix/Google's
canary judge, used by Spinnaker) compares the two samples instead, with a Mann-Whitney test and a
tolerance; Argo Rollouts judges each analysis Successful, Failed or Inconclusive (pause for a human).
This module does both, for one metric at a time, with no database (gates.py feeds it the request log):

- **latency-like metrics** (TTFT, latency): the shift of the candidate against the baseline is the
  Hodges-Lehmann estimate (median of every pairwise difference), with the Mann-Whitney confidence
  interval of that shift (the order statistics of the pairwise differences at the normal approximation of
  the U distribution), both relative to the baseline's median;
- **rates** (errors): the difference of the two proportions with Newcombe's hybrid score interval
  (Wilson intervals of each, method 10 of Newcombe 1998), in absolute points.

Outcome against the tolerance t (the candidate may be worse by up to t):

- **Failed**: the whole interval lies above t (worse by more than t, with the stated confidence);
- **Successful**: the whole interval lies at or below t (not worse by more than t);
- **Inconclusive**: the interval straddles t, or either side has fewer than `min_samples` values.

An identical candidate fails only when its interval's lower end lands above t (at most (1 - confidence)/2
of the time, less since t >= 0), and a small sample gives a wide interval, so it is Inconclusive rather
than Successful. docs/rollouts.md ("Statistical gates") has a worked example; benchmarks/canary_judge.py
measures the rates on the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
from scipy import stats

from models_registry.evaluation.metrics import wilson_interval

SUCCESSFUL = "Successful"
FAILED = "Failed"
INCONCLUSIVE = "Inconclusive"

DEFAULT_CONFIDENCE = 0.95
DEFAULT_MIN_SAMPLES = 20
# Pairwise differences grow as n x m: above this many values a side is subsampled (evenly, sorted, so
# the result does not depend on the request log's row order) to keep one judgement near 50 ms.
MAX_VALUES = 1000


@dataclass(frozen=True)
class Judgement:
    outcome: str  # SUCCESSFUL, FAILED or INCONCLUSIVE
    estimate: float | None  # the candidate's shift (relative, or rate points); None without data
    low: float | None
    high: float | None
    tolerance: float
    confidence: float
    candidate_n: int
    baseline_n: int
    p_value: float | None = None  # one-sided: is the candidate worse at all?
    method: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def explain(self) -> str:
        if self.estimate is None or self.low is None or self.high is None:
            return (
                f"{self.outcome}: {self.candidate_n} candidate and {self.baseline_n} baseline values, "
                f"too few to judge ({self.method})"
            )
        p = f", p = {self.p_value:.3g}" if self.p_value is not None else ""
        return (
            f"{self.outcome}: shift {self.estimate:+.1%} ({self.confidence:.0%} CI {self.low:+.1%} to "
            f"{self.high:+.1%}; tolerance {self.tolerance:.1%}{p}; {self.candidate_n} vs "
            f"{self.baseline_n}; {self.method})"
        )


def _outcome(low: float, high: float, tolerance: float) -> str:
    if low > tolerance:
        return FAILED
    if high <= tolerance:
        return SUCCESSFUL
    return INCONCLUSIVE


def _thin(values: Sequence[float]) -> np.ndarray:
    arr = np.sort(np.asarray(values, dtype=float))
    if len(arr) > MAX_VALUES:
        arr = arr[np.linspace(0, len(arr) - 1, MAX_VALUES).round().astype(int)]
    return arr


def compare_shift(
    candidate: Sequence[float],
    baseline: Sequence[float],
    tolerance: float,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    min_samples: int = DEFAULT_MIN_SAMPLES,
) -> Judgement:
    """Is the candidate's metric (higher is worse: TTFT, latency) above the baseline's by more than
    `tolerance` (relative to the baseline's median)? See the module docstring."""
    n, m = len(candidate), len(baseline)
    method = "Hodges-Lehmann shift, Mann-Whitney interval"
    if n < min_samples or m < min_samples:
        return Judgement(INCONCLUSIVE, None, None, None, tolerance, confidence, n, m, None, method)
    c, b = _thin(candidate), _thin(baseline)
    scale = float(np.median(b))
    if scale <= 0:
        return Judgement(INCONCLUSIVE, None, None, None, tolerance, confidence, n, m, None, method)
    diffs = np.sort(np.subtract.outer(c, b).ravel())
    k_n, k_m = len(c), len(b)
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    # The k-th smallest and k-th largest pairwise differences bound the shift (Hollander & Wolfe,
    # normal approximation of the U statistic's distribution).
    k = math.floor(k_n * k_m / 2 - z * math.sqrt(k_n * k_m * (k_n + k_m + 1) / 12))
    k = min(max(k, 0), len(diffs) - 1)
    low, high = float(diffs[k]) / scale, float(diffs[len(diffs) - 1 - k]) / scale
    estimate = float(np.median(diffs)) / scale
    p_value = float(stats.mannwhitneyu(c, b, alternative="greater").pvalue)
    return Judgement(
        _outcome(low, high, tolerance), estimate, low, high, tolerance, confidence, n, m, p_value, method
    )


def compare_rate(
    candidate_events: int,
    candidate_n: int,
    baseline_events: int,
    baseline_n: int,
    tolerance: float,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    min_samples: int = DEFAULT_MIN_SAMPLES,
) -> Judgement:
    """Is the candidate's event rate (errors) above the baseline's by more than `tolerance` points?"""
    method = "difference of proportions, Newcombe hybrid score interval"
    if candidate_n < min_samples or baseline_n < min_samples:
        return Judgement(
            INCONCLUSIVE, None, None, None, tolerance, confidence, candidate_n, baseline_n, None, method
        )
    p1, p2 = candidate_events / candidate_n, baseline_events / baseline_n
    l1, u1 = wilson_interval(candidate_events, candidate_n, confidence)
    l2, u2 = wilson_interval(baseline_events, baseline_n, confidence)
    diff = p1 - p2
    low = diff - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    high = diff + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    # One-sided exact test that the candidate's rate is higher (Fisher, the 2x2 table of events).
    table = [
        [candidate_events, candidate_n - candidate_events],
        [baseline_events, baseline_n - baseline_events],
    ]
    p_value = float(stats.fisher_exact(table, alternative="greater").pvalue)
    return Judgement(
        _outcome(low, high, tolerance),
        diff,
        low,
        high,
        tolerance,
        confidence,
        candidate_n,
        baseline_n,
        p_value,
        method,
    )
