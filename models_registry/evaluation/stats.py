"""The statistics an evaluation run reports, on scipy.stats: percentiles, bootstrap intervals, McNemar.

Plain functions over numbers; metrics.summarize() calls them. Definitions and a worked example are in
docs/evaluations.md ("Confidence and significance").

Why these choices:
- **Bootstrap by sample, not by position.** The positions of one output are not independent (a
  divergence early shifts everything after it), so an interval that resampled positions would be far
  too narrow. Samples are resampled whole and the pooled ratio (e.g. KL summed over positions / positions)
  is recomputed each time: a cluster bootstrap.
- **Percentile intervals**, not BCa: BCa needs a jackknife of every sample and breaks (NaN) on the
  constant data of a candidate identical to its reference, which is a case we must report as [0, 0].
- **A fixed seed**: the same run summarised twice gives the same interval.
- **McNemar exact**: the discordant cells of a flip table are small (a few flips in 40 cases), where the
  chi-squared approximation is poor; the exact test is a two-sided binomial test of right->wrong among
  all flips against 1/2.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20260
# The quantiles of per-position KL a run reports: llama.cpp's --kl-divergence report lists these.
KL_QUANTILES = {"p50": 50.0, "p90": 90.0, "p99": 99.0, "p99_9": 99.9}


def quantiles(values: Sequence[float]) -> dict[str, float] | None:
    """p50, p90, p99, p99.9 (linear interpolation, numpy's default) and max; None for no values."""
    if not values:
        return None
    arr = np.asarray(values, dtype=float)
    out = {name: float(np.percentile(arr, q)) for name, q in KL_QUANTILES.items()}
    out["max"] = float(arr.max())
    return out


def bootstrap_ratio_ci(
    numerators: Sequence[float],
    denominators: Sequence[float],
    confidence: float = 0.95,
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of sum(numerators) / sum(denominators), resampling the pairs.

    One pair per sample (e.g. its KL summed over positions, and its position count). None when there are
    fewer than two samples or no denominator: no interval can be drawn from one sample.
    """
    num = np.asarray(numerators, dtype=float)
    den = np.asarray(denominators, dtype=float)
    if len(num) != len(den):
        raise ValueError(f"{len(num)} numerators for {len(den)} denominators")
    if len(num) < 2 or den.sum() <= 0:
        return None
    ratio = float(num.sum() / den.sum())
    if np.all(num == num[0]) and np.all(den == den[0]):
        return (ratio, ratio)  # nothing varies: every resample gives the same ratio

    def pooled(n: np.ndarray, d: np.ndarray, axis: int = -1) -> np.ndarray:
        total = d.sum(axis=axis)
        return np.divide(n.sum(axis=axis), total, out=np.full(total.shape, ratio), where=total > 0)

    result = stats.bootstrap(
        (num, den),
        pooled,
        paired=True,
        vectorized=True,
        confidence_level=confidence,
        n_resamples=resamples,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    low, high = result.confidence_interval
    return (float(low), float(high))


def bootstrap_mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean of per-sample values (e.g. chrF)."""
    return bootstrap_ratio_ci(values, [1.0] * len(values), confidence)


def mcnemar_exact(right_to_wrong: int, wrong_to_right: int) -> float:
    """Two-sided exact McNemar p-value: could the flips have gone either way with equal odds?

    1.0 when there are no flips (no evidence of any change).
    """
    flips = right_to_wrong + wrong_to_right
    if flips == 0:
        return 1.0
    return float(stats.binomtest(right_to_wrong, flips, 0.5).pvalue)


def recovery(reference_accuracy: float | None, candidate_accuracy: float | None) -> float | None:
    """Candidate accuracy as a percentage of the reference's (Red Hat's "recovery"); None when the
    reference scored nothing (a ratio to 0 says nothing)."""
    if reference_accuracy is None or candidate_accuracy is None or reference_accuracy <= 0:
        return None
    return 100.0 * candidate_accuracy / reference_accuracy


def describe_interval(ci: tuple[float, float] | None) -> list[float] | None:
    """An interval as the JSON a summary stores ([low, high]) or None."""
    return [ci[0], ci[1]] if ci is not None else None
