"""The knee: the last load level before latency leaves its floor."""

from __future__ import annotations

from typing import Any

from bench.stats import find_knee


def levels(*p50s: float | None) -> list[dict[str, Any]]:
    return [{"clients": i, "latency_s": {"p50": v}} for i, v in enumerate(p50s)]


def test_knee_is_the_level_before_latency_doubles_its_floor() -> None:
    assert find_knee(levels(1.0, 1.1, 1.3, 1.9, 2.4, 5.0)) == 3


def test_no_knee_while_latency_stays_near_its_floor() -> None:
    assert find_knee(levels(1.0, 1.2, 1.5, 1.9)) is None
    assert find_knee([]) is None


def test_the_floor_is_the_lowest_latency_seen_so_far() -> None:
    # A warm-up first level (3.0) does not hide the knee measured from the true floor (1.0).
    assert find_knee(levels(3.0, 1.0, 1.4, 2.5)) == 2


def test_a_level_with_no_success_is_past_the_knee() -> None:
    assert find_knee(levels(1.0, 1.1, None)) == 1


def test_the_rise_factor_is_adjustable() -> None:
    assert find_knee(levels(1.0, 1.3, 1.6), rise=1.5) == 1
