"""Quality from shadow pairs in each step's analysis: exact-match rate and chrF over the step's scored pairs,
flips over the graded ones, KL over those that have one, each against its threshold; below the minimum
sample the gate is Inconclusive, never Successful. Only the candidate's pairs against the baseline as the
primary, in the step's window, count."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone

from models_registry.models import ModelAlias
from routing.models import Rollout, RolloutDecision, ShadowPair
from routing.rollouts import services
from routing.rollouts.gates import Verdict
from tests.routing.rollouts import Canary, canary, log_requests, shadow_pair

pytestmark = pytest.mark.django_db

NOW = timezone.now()


@pytest.fixture
def c(redis_clean: None) -> Canary:
    return canary()


def start(c: Canary, gates: dict[str, float], **analysis: Any) -> Rollout:
    rollout = services.start_rollout(
        c.alias,
        c.v2,
        [5, 25, 100],
        actor=None,
        gates=gates,
        analysis=analysis,
        min_step_seconds=60,
        min_step_requests=20,
    )
    Rollout.objects.filter(pk=rollout.pk).update(step_started_at=NOW - dt.timedelta(seconds=120))
    rollout.refresh_from_db()
    when = rollout.step_started_at + dt.timedelta(seconds=1)
    log_requests(c.alias, c.v1, 200, at=when)
    log_requests(c.alias, c.v2, 25, at=when)
    return rollout


def at(rollout: Rollout) -> dt.datetime:
    return rollout.step_started_at + dt.timedelta(seconds=2)


def graded(c: Canary, rollout: Rollout, flip: str | None, *, kl: float | None = None) -> ShadowPair:
    """A scored pair of an evaluation-style request with a known answer (as an offline suite replayed)."""
    pair = shadow_pair(c.alias, c.v1, c.v2, "42", "42" if flip is None else "41", at=at(rollout))
    pair.scores = {
        **pair.scores,
        "reference_correct": flip != "wrong_to_right",
        "candidate_correct": flip != "right_to_wrong",
        "flip": flip,
        "mean_kl": kl,
    }
    pair.save(update_fields=["scores"])
    return pair


def numbers(rollout: Rollout) -> dict[str, Any]:
    decision = RolloutDecision.objects.filter(rollout=rollout).last()
    assert decision is not None
    return decision.numbers


def test_too_few_pairs_is_inconclusive_then_enough_pairs_decide(c: Canary) -> None:
    rollout = start(c, {"shadow_min_chrf": 80, "shadow_min_exact_match_rate": 0.5}, min_samples=5)
    for _ in range(3):
        shadow_pair(
            c.alias,
            c.v1,
            c.v2,
            "The capital of France is Paris.",
            "The capital of France is Paris.",
            at=at(rollout),
        )
    verdict, rollout = services.evaluate(rollout, NOW)
    assert (verdict, rollout.state) == (Verdict.HOLD, "holding")
    assert rollout.reason.startswith("Inconclusive, holding at 5%")
    assert "shadow_min_chrf: Inconclusive: 3 scored pairs in the step, 5 needed" in rollout.reason
    gate = numbers(rollout)["gates"]["shadow_min_chrf"]
    assert gate["outcome"] == "Inconclusive" and gate["passed"] is None and gate["value"] == 100
    for _ in range(2):
        shadow_pair(
            c.alias,
            c.v1,
            c.v2,
            "The capital of France is Paris.",
            "The capital of France is Paris.",
            at=at(rollout),
        )
    verdict, rollout = services.evaluate(rollout, NOW)
    assert verdict == Verdict.ADVANCE
    n = numbers(rollout)
    assert n["shadow"]["scored"] == 5 and n["shadow"]["exact_match_rate"] == 1.0
    assert n["gates"]["shadow_min_chrf"]["outcome"] == "Successful"
    assert n["gates"]["shadow_min_exact_match_rate"]["detail"].startswith("Successful: 1 over 5 scored pairs")


def test_a_candidate_whose_answers_drift_fails_on_chrf(c: Canary) -> None:
    rollout = start(c, {"shadow_min_chrf": 80}, min_samples=4)
    for n in range(4):
        shadow_pair(
            c.alias, c.v1, c.v2, "The capital of France is Paris.", f"Lyon, I think ({n}).", at=at(rollout)
        )
    shadow_pair(c.alias, c.v1, c.v2, "x", "", error="upstream timeout", at=at(rollout))  # failed: not scored
    verdict, rollout = services.evaluate(rollout, NOW)
    assert verdict == Verdict.ROLLBACK
    assert "Gate failed: shadow_min_chrf = " in rollout.reason
    assert (
        "Failed: " in rollout.reason and "over 4 scored pairs (1 failed on the candidate)" in rollout.reason
    )


def test_flips_count_only_graded_pairs_and_kl_only_pairs_that_have_one(c: Canary) -> None:
    rollout = start(c, {"shadow_max_flip_rate": 0.2, "shadow_max_kl": 0.1}, min_samples=4)
    graded(c, rollout, None, kl=0.0)
    graded(c, rollout, "right_to_wrong", kl=0.2)
    for _ in range(6):  # live traffic: no known answer, no KL
        shadow_pair(c.alias, c.v1, c.v2, "hello there", "hello there", at=at(rollout))
    verdict, rollout = services.evaluate(rollout, NOW)
    assert verdict == Verdict.HOLD
    assert "shadow_max_flip_rate: Inconclusive: 2 graded pairs in the step, 4 needed" in rollout.reason
    assert "shadow_max_kl: Inconclusive: 2 pairs with a KL in the step, 4 needed" in rollout.reason
    graded(c, rollout, None, kl=0.0)
    graded(c, rollout, "wrong_to_right", kl=0.0)
    verdict, rollout = services.evaluate(rollout, NOW)
    assert verdict == Verdict.ROLLBACK
    shadow = numbers(rollout)["shadow"]
    assert (shadow["scored"], shadow["graded"], shadow["flips"], shadow["kl_pairs"]) == (10, 4, 2, 4)
    assert shadow["flip_rate"] == 0.5 and shadow["kl"] == pytest.approx(0.05)
    assert "shadow_max_flip_rate = 0.5 (needs <= 0.2" in rollout.reason
    assert "shadow_max_kl" not in rollout.reason.split("Gate failed:")[1]  # 0.05 passes


def test_only_the_steps_pairs_against_the_baseline_count(c: Canary) -> None:
    rollout = start(c, {"shadow_min_chrf": 80}, min_samples=1)
    other = ModelAlias.objects.create(name="other-alias", active_version=c.v1)
    drift = ("The capital of France is Paris.", "Nothing like it at all")
    shadow_pair(c.alias, c.v1, c.v2, *drift, at=rollout.step_started_at - dt.timedelta(seconds=5))  # earlier
    shadow_pair(c.alias, c.v2, c.v2, *drift, at=at(rollout))  # the canary's own request mirrored to itself
    shadow_pair(other, c.v1, c.v2, *drift, at=at(rollout))  # another alias
    verdict, rollout = services.evaluate(rollout, NOW)
    assert verdict == Verdict.HOLD and "0 scored pairs in the step, 1 needed" in rollout.reason
    shadow_pair(c.alias, c.v1, c.v2, "same", "same", at=at(rollout))
    verdict, rollout = services.evaluate(rollout, NOW)
    assert verdict == Verdict.ADVANCE and numbers(rollout)["shadow"]["pairs"] == 1
