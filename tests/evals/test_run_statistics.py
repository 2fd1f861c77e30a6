"""The run statistics (issue 34, item 1) on values worked by hand, and against independent recomputation.

KL quantiles, the cluster bootstrap, McNemar's exact test, recovery %, the reference token's probability
change and perplexity ratio, the exact-or-top-k label and per-tag tables (docs/evaluations.md,
"Confidence and significance" and "Exact or top-k").
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from models_registry.evaluation import stats
from models_registry.evaluation.metrics import (
    KL_FLOOR,
    KLMethod,
    KLMode,
    SideOutput,
    compare_distributions,
    kl_divergence,
    score_sample,
    summarize,
    tail_mass,
)


def test_quantiles_interpolate_linearly_and_report_the_max() -> None:
    values = [float(i) for i in range(1, 101)]  # 1..100
    q = stats.quantiles(values)
    assert q is not None
    # numpy's linear rule: position (n - 1)·p → 1 + 99·0.9 = 90.1 for p90.
    assert q["p50"] == pytest.approx(50.5)
    assert q["p90"] == pytest.approx(90.1)
    assert q["p99"] == pytest.approx(99.01)
    assert q["p99_9"] == pytest.approx(99.901)
    assert q["max"] == 100.0
    assert stats.quantiles([]) is None


def test_mcnemar_exact_matches_the_binomial_sum_by_hand() -> None:
    # 1 right->wrong, 7 wrong->right: two-sided p = 2·P(X <= 1), X ~ Bin(8, 1/2) = 2·(1 + 8)/256.
    assert stats.mcnemar_exact(1, 7) == pytest.approx(2 * 9 / 256)
    assert stats.mcnemar_exact(7, 1) == pytest.approx(2 * 9 / 256)
    assert stats.mcnemar_exact(3, 3) == pytest.approx(1.0)
    assert stats.mcnemar_exact(0, 0) == 1.0  # no flips, no evidence of change
    assert stats.mcnemar_exact(0, 6) == pytest.approx(2 / 64)


def test_recovery_is_candidate_accuracy_as_a_percentage_of_the_reference() -> None:
    assert stats.recovery(0.8, 0.6) == pytest.approx(75.0)
    assert stats.recovery(0.0, 0.2) is None
    assert stats.recovery(None, 0.5) is None


def test_bootstrap_resamples_samples_whole_and_covers_the_pooled_ratio() -> None:
    rng = random.Random(3)
    # 40 samples of different lengths; a sample's KL is the sum of its positions' KL.
    lengths = [rng.randint(3, 30) for _ in range(40)]
    sums = [sum(rng.expovariate(10.0) for _ in range(n)) for n in lengths]
    ci = stats.bootstrap_ratio_ci(sums, lengths)
    assert ci is not None
    pooled = sum(sums) / sum(lengths)
    assert ci[0] < pooled < ci[1]
    # Same seed, same interval: a run summarised twice shows the same numbers.
    assert stats.bootstrap_ratio_ci(sums, lengths) == ci
    # A constant input has a zero-width interval (BCa would give NaN here).
    assert stats.bootstrap_ratio_ci([0.0] * 5, [10] * 5) == (0.0, 0.0)
    assert stats.bootstrap_ratio_ci([1.0], [3]) is None  # one sample: no interval


def test_bootstrap_interval_narrows_with_more_samples() -> None:
    rng = random.Random(5)
    small = [rng.gauss(60, 15) for _ in range(20)]
    large = small + [rng.gauss(60, 15) for _ in range(380)]
    ci_small = stats.bootstrap_mean_ci(small)
    ci_large = stats.bootstrap_mean_ci(large)
    assert ci_small is not None and ci_large is not None
    assert (ci_large[1] - ci_large[0]) < 0.5 * (ci_small[1] - ci_small[0])


def _normalised(probs: dict[Any, float]) -> dict[Any, float]:
    total = sum(probs.values())
    return {t: math.log(p / total) for t, p in probs.items()}


def test_whole_distributions_give_the_exact_kl_and_say_so() -> None:
    p = _normalised({"a": 0.6, "b": 0.3, "c": 0.1})
    q = _normalised({"a": 0.5, "b": 0.2, "c": 0.3})
    exact = 0.6 * math.log(0.6 / 0.5) + 0.3 * math.log(0.3 / 0.2) + 0.1 * math.log(0.1 / 0.3)
    comparison = compare_distributions([p], [q], KLMode.TEACHER_FORCED, tokens=["b"])
    assert comparison.kl[0] == pytest.approx(exact)
    assert comparison.method == KLMethod.FULL_VOCABULARY
    # The reference wrote "b": its probability moved 0.3 -> 0.2; perplexity terms are -log of each.
    assert comparison.dp == [pytest.approx(-0.1)]
    assert comparison.nll_reference == [pytest.approx(-math.log(0.3))]
    assert comparison.nll_candidate == [pytest.approx(-math.log(0.2))]


def test_a_top_k_listing_is_labelled_with_the_mass_it_left_out() -> None:
    p = {"a": math.log(0.6), "b": math.log(0.3)}  # 0.1 unlisted
    q = {"a": math.log(0.5), "b": math.log(0.2)}  # 0.3 unlisted
    assert tail_mass(p) == pytest.approx(0.1)
    comparison = compare_distributions([p], [q], KLMode.TEACHER_FORCED)
    assert comparison.method == KLMethod.TOP_K
    assert comparison.tails == [pytest.approx(0.3)]
    # With one unlisted token on each side the rest buckets are that token: still the exact value.
    assert comparison.kl[0] == pytest.approx(kl_divergence(p, q))


def _sample(
    ref_tokens: list[str], p: list[dict[str, float]], q: list[dict[str, float]], **kw: object
) -> dict[str, Any]:
    ref = SideOutput(text="".join(ref_tokens), tokens=ref_tokens, top_logprobs=p)
    return score_sample(
        ref,
        ref,
        candidate_scored_reference=q,
        reference_scored_reference=p,
        kl_k=-1,
        **kw,  # type: ignore[arg-type]
    )


def test_summary_pools_positions_and_reports_every_figure() -> None:
    p1 = _normalised({"x": 0.7, "y": 0.2, "z": 0.1})
    q1 = _normalised({"x": 0.6, "y": 0.3, "z": 0.1})
    p2 = _normalised({"x": 0.1, "y": 0.8, "z": 0.1})
    q2 = _normalised({"x": 0.6, "y": 0.3, "z": 0.1})  # the top token changes here
    a = _sample(["x", "y"], [p1, p2], [q1, q2], expected="xy", match_rule="exact")
    b = _sample(["x"], [p1], [q1], expected="nope", match_rule="exact")
    kl1, kl2 = kl_divergence(p1, q1), kl_divergence(p2, q2)
    summary = summarize([a, b], position_kl=[[kl1, kl2], [kl1]], tags=[["math", "short"], ["math"]])

    tf = summary["distributions"][KLMode.TEACHER_FORCED]
    assert tf["method"] == KLMethod.FULL_VOCABULARY and tf["k"] == -1
    assert tf["positions"] == 3
    assert tf["mean_kl"] == pytest.approx((2 * kl1 + kl2) / 3)
    assert tf["top1_agreement"] == pytest.approx(2 / 3)
    assert tf["kl_quantiles"]["max"] == pytest.approx(max(kl1, kl2))
    # Δp of the reference's tokens: x 0.7->0.6 (twice), y 0.8->0.3.
    assert tf["mean_dp"] == pytest.approx((-0.1 - 0.5 - 0.1) / 3)
    assert tf["rms_dp"] == pytest.approx(math.sqrt((0.01 + 0.25 + 0.01) / 3))
    nll_ref = -(2 * math.log(0.7) + math.log(0.8))
    nll_cand = -(2 * math.log(0.6) + math.log(0.3))
    assert tf["perplexity_ratio"] == pytest.approx(math.exp((nll_cand - nll_ref) / 3))
    assert tf["kl_ci"] is not None and tf["kl_ci"][0] <= tf["mean_kl"] <= tf["kl_ci"][1]

    assert summary["flips"]["mcnemar_p"] == 1.0  # identical outputs: no flips
    assert summary["flips"]["recovery"] == pytest.approx(100.0)
    assert set(summary["by_tag"]) == {"math", "short"}
    assert summary["by_tag"]["math"]["samples"] == 2
    assert summary["by_tag"]["short"]["samples"] == 1
    assert summary["by_tag"]["short"]["mean_kl"] == pytest.approx((kl1 + kl2) / 2)
    assert summary["by_tag"]["math"]["reference_accuracy"] == pytest.approx(0.5)


def test_a_sample_with_a_top_k_side_makes_the_run_top_k() -> None:
    whole = _normalised({"x": 0.7, "y": 0.3})
    cut = {"x": math.log(0.7)}
    a = _sample(["x"], [whole], [whole])
    b = _sample(["x"], [whole], [cut])
    assert a["kl_method"] == KLMethod.FULL_VOCABULARY and b["kl_method"] == KLMethod.TOP_K
    summary = summarize([a, b], position_kl=[[0.0], [0.0]])
    tf = summary["distributions"][KLMode.TEACHER_FORCED]
    assert tf["method"] == KLMethod.TOP_K
    assert tf["tail_mass_max"] == pytest.approx(0.3)


def rule_kl(reference: dict[Any, float], candidate: dict[Any, float]) -> float:
    """The KL rule of docs/evaluations.md written out plainly, as the oracle of both computed paths: the
    support is both listings plus a rest bucket; each side's unlisted mass is shared evenly by the support
    tokens it did not list and its rest bucket; candidate probabilities are floored at KL_FLOOR."""
    support = set(reference) | set(candidate)

    def completed(listed: dict[Any, float]) -> tuple[dict[Any, float], float]:
        probs = {tok: math.exp(lp) for tok, lp in listed.items()}
        missing = [tok for tok in support if tok not in probs]
        share = max(0.0, 1.0 - sum(probs.values())) / (len(missing) + 1)
        return {**probs, **dict.fromkeys(missing, share)}, share

    p, p_rest = completed(reference)
    q, q_rest = completed(candidate)
    total = sum(pt * (math.log(pt) - math.log(max(q[t], KL_FLOOR))) for t, pt in p.items() if pt > 0)
    if p_rest > 0:
        total += p_rest * (math.log(p_rest) - math.log(max(q_rest, KL_FLOOR)))
    return max(0.0, total)


def test_the_array_path_for_long_listings_computes_the_same_kl() -> None:
    """Whole-vocabulary listings (thousands of tokens) take numpy, short ones a loop: both are the rule."""
    from models_registry.evaluation import metrics

    rng = random.Random(11)
    for overlap in (1.0, 0.9, 0.5, 0.0):
        ids = list(range(400))
        ref_ids = rng.sample(ids, 150)
        shared = ref_ids[: int(150 * overlap)]
        cand_ids = shared + rng.sample([i for i in ids if i not in ref_ids], 150 - len(shared))
        for listed_mass in (1.0, 0.97):
            ref = _normalised({i: rng.random() ** 3 + 1e-9 for i in ref_ids})
            cand = _normalised({i: rng.random() ** 3 + 1e-9 for i in cand_ids})
            ref = {i: lp + math.log(listed_mass) for i, lp in ref.items()}
            assert len(ref) + len(cand) > metrics._ARRAY_PATH_FROM
            fast = metrics._kl_arrays(ref, cand)[0]
            assert fast == pytest.approx(rule_kl(ref, cand), rel=1e-9, abs=1e-12)
            assert kl_divergence(ref, cand) == fast
            # The short path on a cut of the same listings: the same rule again.
            short_ref = dict(list(ref.items())[:20])
            short_cand = dict(list(cand.items())[:20])
            assert kl_divergence(short_ref, short_cand) == pytest.approx(
                rule_kl(short_ref, short_cand), rel=1e-9, abs=1e-12
            )
