"""Each step's analysis limits (Argo Rollouts' failureLimit, inconclusiveLimit, consecutiveErrorLimit,
dryRun): a gate failing more than its failure limit fails the step, Inconclusive beyond its limit pauses for
a person, a gate that cannot be measured more than its limit in a row fails, and a dry-run gate that fails
decides nothing. One gate evaluation (services.evaluate) is one measurement."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

import pytest
from django.utils import timezone

from models_registry.models import ModelVersion
from routing.models import Rollout, RolloutDecision
from routing.rollouts import gates, services
from routing.rollouts.gates import Verdict
from tests.routing.rollouts import Canary, canary, log_requests, shadow_pair

pytestmark = pytest.mark.django_db

NOW = timezone.now()


@pytest.fixture
def c(redis_clean: None) -> Canary:
    return canary()


def start(c: Canary, **kw: Any) -> Rollout:
    plan: dict[str, Any] = {"steps": [5, 25, 100], "min_step_seconds": 60, "min_step_requests": 20, **kw}
    rollout = services.start_rollout(c.alias, c.v2, plan.pop("steps"), actor=None, **plan)
    Rollout.objects.filter(pk=rollout.pk).update(step_started_at=NOW - dt.timedelta(seconds=120))
    rollout.refresh_from_db()
    return rollout


def at(rollout: Rollout) -> dt.datetime:
    return rollout.step_started_at + dt.timedelta(seconds=1)


def tick(rollout: Rollout, n: int) -> tuple[str, Rollout]:
    return services.evaluate(rollout, NOW + dt.timedelta(seconds=n))


def history(rollout: Rollout) -> list[str]:
    return list(RolloutDecision.objects.filter(rollout=rollout).values_list("action", flat=True))


def last_gate(rollout: Rollout, key: str) -> dict[str, Any]:
    decision = RolloutDecision.objects.filter(rollout=rollout).last()
    assert decision is not None
    return decision.numbers["gates"][key]


def erroring_candidate(c: Canary, rollout: Rollout) -> None:
    """6 of the candidate's 20 requests fail (30 %) against 2 of the baseline's 202."""
    log_requests(c.alias, c.v1, 200, at=at(rollout))
    log_requests(c.alias, c.v1, 2, status=502, error_type="upstream_disconnected", at=at(rollout))
    log_requests(c.alias, c.v2, 14, at=at(rollout))
    log_requests(c.alias, c.v2, 6, status=500, at=at(rollout))


def healthy(c: Canary, rollout: Rollout) -> None:
    log_requests(c.alias, c.v1, 200, latency_ms=100, ttft_ms=20, at=at(rollout))
    log_requests(c.alias, c.v2, 25, latency_ms=110, ttft_ms=21, at=at(rollout))


@pytest.mark.parametrize(
    "analysis",
    [{"failure_limit": 2}, {"metrics": {"max_error_rate_delta": {"failure_limit": 2}}}],
    ids=["for-every-gate", "per-gate"],
)
def test_failures_within_the_limit_hold_and_one_more_rolls_back(c: Canary, analysis: dict[str, Any]) -> None:
    rollout = start(c, gates={"max_error_rate_delta": 0.05}, analysis=analysis)
    erroring_candidate(c, rollout)
    for n in (1, 2):
        verdict, rollout = tick(rollout, n)
        assert (verdict, rollout.state, rollout.share) == (Verdict.HOLD, "holding", 5.0)
    assert rollout.reason.startswith("Failed within its limit, holding at 5%: max_error_rate_delta = 0.2901")
    assert "failed 1 of the 2 measurements allowed" in rollout.reason
    assert history(rollout) == ["start", "hold"]  # the same cause is written once
    assert Rollout.objects.get(pk=rollout.pk).analysis_state["metrics"]["max_error_rate_delta"]["failed"] == 2
    verdict, rollout = tick(rollout, 3)
    assert (verdict, rollout.state, rollout.share) == (Verdict.ROLLBACK, "rolled_back", 0.0)
    assert (
        "Gate failed: max_error_rate_delta = 0.2901 (needs <= 0.05; candidate 6/20 = 30.00%" in rollout.reason
    )
    assert "failed 3 measurements, limit 2)" in rollout.reason
    gate = last_gate(rollout, "max_error_rate_delta")
    assert gate["outcome"] == "Failed" and gate["counts"]["failed"] == 3
    assert gate["limits"]["failure_limit"] == 2


def test_without_a_limit_the_first_failure_rolls_back_as_before(c: Canary) -> None:
    rollout = start(c, gates={"max_error_rate_delta": 0.05})
    erroring_candidate(c, rollout)
    verdict, rollout = tick(rollout, 1)
    assert verdict == Verdict.ROLLBACK
    assert (
        "Gate failed: max_error_rate_delta = 0.2901 (needs <= 0.05; candidate 6/20 = 30.00%, baseline "
        in (rollout.reason)
    )
    assert "limit" not in rollout.reason


def spread(n: int, median: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [median * rng.lognormvariate(0.0, 0.2) for _ in range(n)]


def log_ttfts(c: Canary, rollout: Rollout, version: ModelVersion, ttfts: list[float]) -> None:
    for ttft in ttfts:
        log_requests(c.alias, version, 1, latency_ms=ttft * 5, ttft_ms=ttft, at=at(rollout))


def test_inconclusive_beyond_its_limit_pauses_for_a_person_and_resume_measures_again(c: Canary) -> None:
    rollout = start(c, gates={"ttft_tolerance": 0.02}, analysis={"inconclusive_limit": 1})
    log_ttfts(c, rollout, c.v1, spread(40, 40.0, 5))
    log_ttfts(c, rollout, c.v2, spread(25, 40.0, 6))  # too few to tell 2 %: Inconclusive
    verdict, rollout = tick(rollout, 1)
    assert verdict == Verdict.HOLD and rollout.reason.startswith("Inconclusive, holding at 5%")
    verdict, rollout = tick(rollout, 2)
    assert (verdict, rollout.state, rollout.share) == (Verdict.PAUSE, "paused", 5.0)
    assert rollout.reason.startswith("Inconclusive beyond its limit, paused at 5% for a person")
    assert "ttft_tolerance Inconclusive 2 times, limit 1" in rollout.reason
    assert history(rollout) == ["start", "hold", "pause"]
    pause = RolloutDecision.objects.filter(rollout=rollout).last()
    assert pause is not None and pause.actor is None
    assert pause.numbers["gates"]["ttft_tolerance"]["counts"]["inconclusive"] == 2
    # Paused: the gate task leaves it to its person.
    assert tick(rollout, 3)[0] == Verdict.KEEP
    # A person resumes: the step is measured afresh (not paused again at once).
    rollout = services.resume(rollout, actor=None)
    assert rollout.analysis_state == {}
    verdict, rollout = tick(rollout, 4)
    assert verdict == Verdict.HOLD and rollout.state == "holding"


def test_without_an_inconclusive_limit_it_holds_until_the_data_decides(c: Canary) -> None:
    rollout = start(c, gates={"ttft_tolerance": 0.02})
    log_ttfts(c, rollout, c.v1, spread(40, 40.0, 5))
    log_ttfts(c, rollout, c.v2, spread(25, 40.0, 6))
    for n in range(5):
        verdict, rollout = tick(rollout, n)
        assert verdict == Verdict.HOLD
    assert history(rollout) == ["start", "hold"]
    assert Rollout.objects.get(pk=rollout.pk).analysis_state["metrics"]["ttft_tolerance"]["inconclusive"] == 5


def test_consecutive_errors_beyond_the_limit_fail_and_a_good_measurement_resets_them(
    c: Canary, monkeypatch: pytest.MonkeyPatch
) -> None:
    rollout = start(
        c,
        gates={"max_error_rate_delta": 0.05, "shadow_min_chrf": 80},
        analysis={"consecutive_error_limit": 2},
    )
    healthy(c, rollout)
    for n in range(3):
        shadow_pair(
            c.alias, c.v1, c.v2, "same answer", "same answer", at=at(rollout) + dt.timedelta(seconds=n)
        )
    broken = {"on": True}
    real = gates.shadow_figures

    def flaky(*args: Any) -> dict[str, Any]:
        if broken["on"]:
            raise RuntimeError("shadow pairs unreadable")
        return real(*args)

    monkeypatch.setattr(gates, "shadow_figures", flaky)
    for n in (1, 2):
        verdict, rollout = tick(rollout, n)
        assert verdict == Verdict.HOLD
    assert rollout.reason.startswith("Measurement error, holding at 5%: shadow_min_chrf (1 in a row, limit 2")
    assert "RuntimeError: shadow pairs unreadable" in rollout.reason
    # One measurement that works (Inconclusive: 3 pairs, 20 needed) ends the run of errors.
    broken["on"] = False
    verdict, rollout = tick(rollout, 3)
    assert verdict == Verdict.HOLD, rollout.reason
    broken["on"] = True
    for n in (4, 5):
        verdict, rollout = tick(rollout, n)
        assert verdict == Verdict.HOLD
    verdict, rollout = tick(rollout, 6)
    assert (verdict, rollout.state) == (Verdict.ROLLBACK, "rolled_back")
    assert rollout.reason.startswith(
        "Analysis error: shadow_min_chrf could not be measured 3 times in a row (limit 2"
    )
    gate = last_gate(rollout, "shadow_min_chrf")
    assert (
        gate["outcome"] == "Error"
        and gate["counts"]["errors"] == 5
        and gate["counts"]["consecutive_errors"] == 3
    )
    # The traffic gate was measured all along.
    assert last_gate(rollout, "max_error_rate_delta")["outcome"] == "Successful"


def test_a_dry_run_gate_that_fails_does_not_fail_the_step(c: Canary) -> None:
    rollout = start(
        c,
        gates={"max_error_rate_delta": 0.05, "shadow_min_chrf": 80},
        analysis={"metrics": {"shadow_min_chrf": {"dry_run": True, "min_samples": 3}}},
    )
    healthy(c, rollout)
    for n in range(4):
        shadow_pair(c.alias, c.v1, c.v2, "Paris is the capital.", f"Lyon {n} maybe", at=at(rollout))
    verdict, rollout = tick(rollout, 1)
    assert (verdict, rollout.share) == (Verdict.ADVANCE, 25.0)
    assert "(max_error_rate_delta = 0; dry run, not deciding: shadow_min_chrf Failed = 2.033); on to 25%" in (
        rollout.reason
    )
    gate = last_gate(rollout, "shadow_min_chrf")
    assert gate["dry_run"] is True and gate["outcome"] == "Failed" and gate["passed"] is False
    assert gate["counts"]["failed"] == 1 and gate["value"] < 80


def test_a_dry_run_gate_that_cannot_be_judged_does_not_hold_the_step(c: Canary) -> None:
    rollout = start(
        c, gates={"ttft_tolerance": 0.02}, analysis={"metrics": {"ttft_tolerance": {"dry_run": True}}}
    )
    log_ttfts(c, rollout, c.v1, spread(40, 40.0, 5))
    log_ttfts(c, rollout, c.v2, spread(25, 40.0, 6))
    verdict, rollout = tick(rollout, 1)
    assert verdict == Verdict.ADVANCE
    assert last_gate(rollout, "ttft_tolerance")["outcome"] == "Inconclusive"
