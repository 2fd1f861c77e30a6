"""The statistical canary judge (routing/rollouts/judge.py; issue 34, item 5) on seeded samples and on
published worked examples. The rates at realistic traffic come from benchmarks/canary_judge.py, on
TTFTs measured from the simulator; these tests pin the rules."""

from __future__ import annotations

import random

import pytest

from routing.rollouts import judge


def lognormal(rng: random.Random, n: int, median_ms: float, scale: float = 1.0) -> list[float]:
    return [median_ms * scale * rng.lognormvariate(0.0, 0.3) for _ in range(n)]


def test_an_identical_candidate_with_enough_traffic_is_successful() -> None:
    """20 seeded trials of 1,000 candidate against 3,000 baseline values from one distribution: the
    interval is narrow enough to say "within 5 %" nearly every time, and never "worse"."""
    outcomes = []
    for seed in range(20):
        rng = random.Random(seed)
        j = judge.compare_shift(lognormal(rng, 1000, 80.0), lognormal(rng, 3000, 80.0), 0.05)
        outcomes.append(j.outcome)
        assert j.low is not None and j.high is not None and j.low < 0.05
    assert outcomes.count(judge.SUCCESSFUL) >= 19 and judge.FAILED not in outcomes


def test_a_candidate_ten_percent_slower_fails_against_a_five_percent_tolerance() -> None:
    rng = random.Random(2)
    j = judge.compare_shift(lognormal(rng, 300, 80.0, 1.10), lognormal(rng, 900, 80.0), 0.05)
    assert j.outcome == judge.FAILED
    assert j.estimate == pytest.approx(0.10, abs=0.03)
    assert j.low is not None and j.low > 0.05
    assert j.p_value is not None and j.p_value < 0.001
    assert "Failed: shift +" in j.explain()


def test_a_small_sample_is_inconclusive_not_successful() -> None:
    rng = random.Random(3)
    few = judge.compare_shift(lognormal(rng, 10, 80.0), lognormal(rng, 900, 80.0), 0.05)
    assert few.outcome == judge.INCONCLUSIVE and few.estimate is None
    assert "too few to judge" in few.explain()
    # Enough to judge, not enough to be sure: the interval straddles the tolerance.
    some = judge.compare_shift(lognormal(rng, 25, 80.0), lognormal(rng, 25, 80.0), 0.05)
    assert some.outcome == judge.INCONCLUSIVE and some.low is not None and some.high is not None
    assert some.low <= 0.05 < some.high


def test_the_shift_interval_covers_the_true_shift_about_as_often_as_it_says() -> None:
    """The Mann-Whitney interval of the Hodges-Lehmann shift, 300 seeded trials at a true shift of 0."""
    rng = random.Random(4)
    covered = 0
    for _ in range(300):
        j = judge.compare_shift(lognormal(rng, 40, 50.0), lognormal(rng, 60, 50.0), 0.0)
        assert j.low is not None and j.high is not None
        covered += j.low <= 0.0 <= j.high
    assert 0.91 <= covered / 300 <= 0.99


def test_rate_interval_is_newcombes_published_example() -> None:
    # Newcombe (1998), "Interval estimation for the difference between independent proportions",
    # method 10 on 56/70 vs 48/80: 0.0524 to 0.3339; and on 9/10 vs 3/10: 0.1705 to 0.8090.
    j = judge.compare_rate(56, 70, 48, 80, 0.02)
    assert (j.low, j.high) == (pytest.approx(0.0524, abs=5e-5), pytest.approx(0.3339, abs=5e-5))
    assert j.outcome == judge.FAILED  # the whole interval is above 2 points
    k = judge.compare_rate(9, 10, 3, 10, 0.0, min_samples=10)
    assert (k.low, k.high) == (pytest.approx(0.1705, abs=5e-5), pytest.approx(0.8090, abs=5e-5))


def test_rates_within_tolerance_pass_and_few_requests_are_inconclusive() -> None:
    ok = judge.compare_rate(2, 400, 6, 1200, 0.02)
    assert ok.outcome == judge.SUCCESSFUL and ok.high is not None and ok.high <= 0.02
    assert judge.compare_rate(1, 5, 0, 900, 0.02).outcome == judge.INCONCLUSIVE


def test_the_worked_example_of_docs_rollouts() -> None:
    j = judge.compare_shift([12, 14, 16], [10, 11, 12], 0.05, min_samples=1)
    # Differences 0 1 2 2 3 4 4 5 6: shift 3 ms of a 11 ms median; k = 0, so the interval is 0 to 6 ms.
    assert j.estimate == pytest.approx(3 / 11)
    assert (j.low, j.high) == (0.0, pytest.approx(6 / 11))
    assert j.outcome == judge.INCONCLUSIVE
    assert j.p_value == pytest.approx(0.0606, abs=5e-4)
