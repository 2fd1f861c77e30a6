"""The canary control plane's decisions, on request-log rows written directly (real PostgreSQL).

Each test sets a step's window (step_started_at) and the figures inside it, runs one gate evaluation
(services.evaluate, what the beat task runs per rollout) and checks the verdict, the rollout's new
share and state, and the decision history with its numbers and the audit trail.
"""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

import pytest
from django.utils import timezone

from core.models import AuditEvent
from models_registry.evaluation.review import sign_run
from models_registry.models import ModelAlias
from nodes.models import Deployment
from routing.models import Rollout, RolloutDecision, ShadowPair
from routing.rollouts import services
from routing.rollouts.gates import Verdict
from routing.rollouts.plans import PlanError
from routing.tasks import evaluate_rollouts_task
from tests.routing.rollouts import (
    Canary,
    accepted_run,
    canary,
    completed_run,
    log_requests,
    new_version,
    ready_deployment,
)

pytestmark = pytest.mark.django_db

NOW = timezone.now()


@pytest.fixture
def c(redis_clean: None) -> Canary:
    return canary()


def start(c: Canary, **kw: Any) -> Rollout:
    plan: dict[str, Any] = {
        "steps": [5, 25, 100],
        "gates": {"max_error_rate_delta": 0.05, "max_p95_latency_ratio": 1.5, "max_ttft_p95_ratio": 1.5},
        "min_step_seconds": 60,
        "min_step_requests": 20,
    }
    plan.update(kw)
    return services.start_rollout(c.alias, c.v2, plan.pop("steps"), actor=None, **plan)


def aged(rollout: Rollout, seconds: float) -> Rollout:
    """Pretend the current step started `seconds` before NOW."""
    Rollout.objects.filter(pk=rollout.pk).update(step_started_at=NOW - dt.timedelta(seconds=seconds))
    rollout.refresh_from_db()
    return rollout


def in_window(rollout: Rollout) -> dt.datetime:
    return rollout.step_started_at + dt.timedelta(seconds=1)


def healthy_traffic(c: Canary, rollout: Rollout, candidate: int = 25, baseline: int = 200) -> None:
    at = in_window(rollout)
    log_requests(c.alias, c.v1, baseline, latency_ms=100, ttft_ms=20, at=at)
    log_requests(c.alias, c.v2, candidate, latency_ms=110, ttft_ms=21, at=at)


def history(rollout: Rollout) -> list[str]:
    return list(RolloutDecision.objects.filter(rollout=rollout).values_list("action", flat=True))


# -- starting ------------------------------------------------------------------------------------------------


def test_start_records_the_plan_the_decision_and_the_audit(c: Canary) -> None:
    rollout = start(c)
    assert rollout.state == "running" and rollout.share == 5.0 and rollout.step_index == 0
    assert rollout.baseline_version == c.v1 and rollout.candidate_version == c.v2
    [decision] = RolloutDecision.objects.filter(rollout=rollout)
    assert (decision.action, decision.from_share, decision.to_share) == ("start", 0.0, 5.0)
    assert decision.numbers["plan"]["steps"] == [5.0, 25.0, 100.0]
    event = AuditEvent.objects.get(object_type="routing.rollout", object_id=str(rollout.pk))
    assert event.action == "create" and (event.after or {})["decision"] == "start"


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([5, 5, 100], "Steps must rise: step 2 (5%) is not above step 1 (5%)"),
        ([25, 5, 100], "Steps must rise"),
        ([5, 50], "The last step must be 100"),
        ([0, 50, 100], "every step must be above 0"),
        ([5, 150], "every step must be above 0 and at most 100"),
        ([100], "at least one step below 100"),
        ([], "list of percentages"),
        (["5", 100], "must be a number"),
    ],
)
def test_bad_steps_are_refused_by_field(c: Canary, steps: Any, message: str) -> None:
    with pytest.raises(PlanError) as err:
        start(c, steps=steps)
    assert err.value.field == "steps" and message in err.value.message
    assert not Rollout.objects.exists()


def test_candidate_without_a_ready_deployment_is_refused(c: Canary) -> None:
    v3 = new_version(c.alias, "v3")
    with pytest.raises(PlanError) as err:
        services.start_rollout(c.alias, v3, [5, 100], actor=None)
    assert err.value.field == "candidate_version"
    assert "no ready deployment serving 'llama-canary'" in err.value.message
    # A ready deployment of v3 under another served name does not count.
    other = ModelAlias.objects.create(name="other-alias", active_version=c.v1)
    ready_deployment(other, v3)
    with pytest.raises(PlanError):
        services.start_rollout(c.alias, v3, [5, 100], actor=None)


def test_candidate_equal_to_the_active_version_is_refused(c: Canary) -> None:
    with pytest.raises(PlanError) as err:
        services.start_rollout(c.alias, c.v1, [5, 100], actor=None)
    assert err.value.field == "candidate_version" and "already the active version" in err.value.message


def test_a_second_active_rollout_on_the_alias_is_refused(c: Canary) -> None:
    first = start(c)
    v3 = new_version(c.alias, "v3")
    ready_deployment(c.alias, v3)
    with pytest.raises(PlanError) as err:
        services.start_rollout(c.alias, v3, [5, 100], actor=None)
    assert err.value.field == "alias" and "already has an active rollout" in err.value.message
    # Once the first is finished, a new one may start.
    services.rollback(first, actor=None, reason="done")
    assert services.start_rollout(c.alias, v3, [5, 100], actor=None).state == "running"


def test_unknown_or_bad_gates_are_refused(c: Canary) -> None:
    with pytest.raises(PlanError) as err:
        start(c, gates={"max_latency": 2})
    assert err.value.field == "gates" and "Unknown gates ['max_latency']" in err.value.message
    with pytest.raises(PlanError) as err:
        start(c, gates={"max_p95_latency_ratio": 0.5})
    assert "below 1 would fail an identical candidate" in err.value.message
    with pytest.raises(PlanError) as err:
        start(c, gates={"max_error_rate_delta": 2})
    assert "at most 1" in err.value.message


# -- the gate task -------------------------------------------------------------------------------------------


def test_a_young_step_is_kept_without_a_record(c: Canary) -> None:
    rollout = aged(start(c), 30)
    healthy_traffic(c, rollout)
    verdict, after = services.evaluate(rollout, NOW)
    assert verdict == Verdict.KEEP
    assert after.state == "running" and after.share == 5.0
    assert history(rollout) == ["start"]


def test_too_little_data_holds_once(c: Canary) -> None:
    rollout = aged(start(c), 120)
    healthy_traffic(c, rollout, candidate=5)
    verdict, after = services.evaluate(rollout, NOW)
    assert verdict == Verdict.HOLD and after.state == "holding" and after.share == 5.0
    decision = RolloutDecision.objects.filter(rollout=rollout).last()
    assert decision is not None
    assert "Not enough data: 5 candidate requests in the step, 20 needed" in decision.reason
    assert decision.numbers["candidate"]["requests"] == 5
    # Further ticks with still too little data write nothing more.
    services.evaluate(after, NOW + dt.timedelta(seconds=10))
    services.evaluate(after, NOW + dt.timedelta(seconds=20))
    assert history(rollout) == ["start", "hold"]
    # Enough data arrives: it advances out of holding.
    log_requests(c.alias, c.v2, 20, latency_ms=100, ttft_ms=20, at=in_window(rollout))
    verdict, after = services.evaluate(after, NOW + dt.timedelta(seconds=30))
    assert verdict == Verdict.ADVANCE and after.state == "running" and after.share == 25.0
    assert history(rollout) == ["start", "hold", "advance"]


def test_healthy_step_advances_with_its_numbers(c: Canary) -> None:
    rollout = aged(start(c), 120)
    healthy_traffic(c, rollout)
    # Rows outside the window or of another alias do not count.
    log_requests(c.alias, c.v2, 50, status=500, at=rollout.step_started_at - dt.timedelta(seconds=5))
    other = ModelAlias.objects.create(name="other", active_version=c.v1)
    log_requests(other, c.v2, 50, status=500, at=in_window(rollout))

    verdict, after = services.evaluate(rollout, NOW)
    assert verdict == Verdict.ADVANCE
    assert (after.step_index, after.share, after.state) == (1, 25.0, "running")
    assert after.step_started_at == NOW
    decision = RolloutDecision.objects.filter(rollout=rollout).last()
    assert decision is not None and (decision.action, decision.from_share, decision.to_share) == (
        "advance",
        5,
        25,
    )
    n = decision.numbers
    assert n["candidate"]["requests"] == 25 and n["candidate"]["errors"] == 0
    assert n["baseline"]["requests"] == 200
    assert n["candidate"]["p95_latency_ms"] == 110 and n["baseline"]["p95_latency_ms"] == 100
    assert n["gates"]["max_p95_latency_ratio"]["value"] == pytest.approx(1.1)
    assert n["gates"]["max_p95_latency_ratio"]["passed"] is True
    assert n["gates"]["max_error_rate_delta"]["value"] == 0
    assert "on to 25%" in decision.reason
    audit = AuditEvent.objects.filter(object_type="routing.rollout").order_by("id").last()
    assert audit is not None and audit.after is not None and audit.after["decision"] == "advance"
    assert audit.after["numbers"]["candidate"]["requests"] == 25


def test_errors_over_the_gate_roll_back_naming_the_gate_and_its_numbers(c: Canary) -> None:
    rollout = aged(start(c), 30)  # young: a failed gate does not wait for min_step_seconds
    at = in_window(rollout)
    log_requests(c.alias, c.v1, 200, at=at)
    log_requests(c.alias, c.v1, 2, status=502, error_type="upstream_disconnected", at=at)
    log_requests(c.alias, c.v2, 14, at=at)
    log_requests(c.alias, c.v2, 6, status=500, error_type="upstream_500", at=at)
    verdict, after = services.evaluate(rollout, NOW)
    assert verdict == Verdict.ROLLBACK
    assert (after.state, after.share) == ("rolled_back", 0.0) and after.finished_at is not None
    assert "Gate failed: max_error_rate_delta = 0.2901 (needs <= 0.05" in after.reason
    assert "candidate 6/20 = 30.00%, baseline 2/202 = 0.99%" in after.reason
    decision = RolloutDecision.objects.filter(rollout=rollout).last()
    assert decision is not None and decision.action == "rollback" and decision.to_share == 0
    assert decision.actor is None and decision.numbers["gates"]["max_error_rate_delta"]["passed"] is False


def test_client_errors_do_not_count_against_the_candidate(c: Canary) -> None:
    rollout = aged(start(c), 120)
    healthy_traffic(c, rollout)
    log_requests(c.alias, c.v2, 20, status=429, error_type="rate_limited", at=in_window(rollout))
    log_requests(c.alias, c.v2, 5, status=499, error_type="client_disconnected", at=in_window(rollout))
    verdict, _ = services.evaluate(rollout, NOW)
    assert verdict == Verdict.ADVANCE


def test_a_gate_waits_for_the_minimum_sample_before_it_fails(c: Canary) -> None:
    rollout = aged(start(c), 30)
    log_requests(c.alias, c.v1, 100, at=in_window(rollout))
    log_requests(c.alias, c.v2, 3, status=500, at=in_window(rollout))  # 3 of 20 needed
    verdict, after = services.evaluate(rollout, NOW)
    assert verdict == Verdict.KEEP and after.state == "running"


@pytest.mark.parametrize(
    ("gate", "field"), [("max_p95_latency_ratio", "latency_ms"), ("max_ttft_p95_ratio", "ttft_ms")]
)
def test_a_slow_candidate_is_rolled_back(c: Canary, gate: str, field: str) -> None:
    rollout = aged(start(c), 120)
    at = in_window(rollout)
    log_requests(c.alias, c.v1, 200, latency_ms=100, ttft_ms=20, at=at)
    slow = {"latency_ms": 100.0, "ttft_ms": 20.0, field: 400.0 if field == "latency_ms" else 80.0}
    log_requests(c.alias, c.v2, 25, at=at, **slow)  # type: ignore[arg-type]
    verdict, after = services.evaluate(rollout, NOW)
    assert verdict == Verdict.ROLLBACK and after.share == 0
    assert f"Gate failed: {gate} = 4 (needs <= 1.5" in after.reason


def test_a_candidate_whose_deployments_all_died_is_rolled_back_even_when_paused(c: Canary) -> None:
    rollout = services.pause(start(c), actor=None)
    assert services.evaluate(rollout, NOW)[0] == Verdict.KEEP  # paused and alive: left to its person
    Deployment.objects.filter(model_version=c.v2).update(state="crashed")
    verdict, after = services.evaluate(rollout, NOW)
    assert verdict == Verdict.ROLLBACK and after.state == "rolled_back" and after.share == 0
    assert "has no ready deployment serving 'llama-canary' (all died or were stopped)" in after.reason
    assert history(rollout) == ["start", "pause", "rollback"]


def test_last_step_promotes_and_switches_the_alias(c: Canary) -> None:
    rollout = aged(start(c, steps=[5, 100]), 120)
    healthy_traffic(c, rollout)
    verdict, after = services.evaluate(rollout, NOW)
    assert verdict == Verdict.PROMOTE
    assert (after.state, after.share, after.step_index) == ("promoted", 100.0, 1)
    c.alias.refresh_from_db()
    assert c.alias.active_version == c.v2
    switch = AuditEvent.objects.get(action="switch", object_type="models_registry.modelalias")
    assert switch.before == {"active_version": c.v1.pk, "version": str(c.v1)}
    assert history(rollout) == ["start", "promote"]


def test_promotion_waits_for_the_signoff_when_the_plan_requires_it(c: Canary) -> None:
    rollout = aged(start(c, steps=[5, 100], require_signoff=True), 120)
    healthy_traffic(c, rollout)
    verdict, after = services.evaluate(rollout, NOW)
    assert verdict == Verdict.HOLD and after.state == "holding"
    assert "promotion waits: The plan requires a signed-off offline evaluation" in after.reason
    c.alias.refresh_from_db()
    assert c.alias.active_version == c.v1
    with pytest.raises(PlanError) as err:
        services.promote(after, actor=None)
    assert err.value.field == "require_signoff"

    accepted_run(c.v2)
    verdict, after = services.evaluate(after, NOW + dt.timedelta(seconds=10))
    assert verdict == Verdict.PROMOTE and after.state == "promoted"
    c.alias.refresh_from_db()
    assert c.alias.active_version == c.v2


def test_only_an_accept_in_force_signs_the_candidate_off(c: Canary, settings: Any) -> None:
    """A completed but unsigned run, or one whose accept a later reject superseded, is no sign-off."""
    # The run stands for an offline evaluation without its samples; how many an accept needs is
    # tests/evals/test_review_api.py's matter.
    settings.EVAL_MIN_SCORED_SAMPLES = 0
    rollout = aged(start(c, steps=[5, 100], require_signoff=True), 120)
    healthy_traffic(c, rollout)
    run = completed_run(c.v2)
    verdict, after = services.evaluate(rollout, NOW)
    assert verdict == Verdict.HOLD and after.state == "holding"

    sign_run(run, "accept", actor=None)
    sign_run(run, "reject", "the arithmetic cases regressed", actor=None)
    with pytest.raises(PlanError) as err:
        services.promote(after, actor=None)
    assert err.value.field == "require_signoff"

    sign_run(run, "accept", "re-reviewed: acceptable", actor=None)
    promoted = services.promote(Rollout.objects.get(pk=rollout.pk), actor=None)
    assert promoted.state == "promoted"
    c.alias.refresh_from_db()
    assert c.alias.active_version == c.v2


def test_a_hold_for_a_new_cause_is_recorded_once_more(c: Canary) -> None:
    rollout = aged(start(c, steps=[5, 100], require_signoff=True), 120)
    healthy_traffic(c, rollout, candidate=5)
    assert services.evaluate(rollout, NOW)[0] == Verdict.HOLD
    log_requests(c.alias, c.v2, 20, latency_ms=100, ttft_ms=20, at=in_window(rollout))
    rollout.refresh_from_db()
    for n in range(3):
        verdict, rollout = services.evaluate(rollout, NOW + dt.timedelta(seconds=n))
        assert verdict == Verdict.HOLD
    assert history(rollout) == ["start", "hold", "hold"]
    assert rollout.reason.startswith("Gates passed; promotion waits")


def test_quality_gates_from_shadow_pairs(c: Canary) -> None:
    rollout = aged(start(c, gates={"min_chrf": 80}), 120)
    healthy_traffic(c, rollout)
    verdict, after = services.evaluate(rollout, NOW)
    assert verdict == Verdict.HOLD  # gate configured, no figure yet
    assert "min_chrf: no chrf yet" in after.reason
    ShadowPair.objects.bulk_create(
        [
            ShadowPair(alias=c.alias.name, candidate_version_id=c.v2.pk, chrf=chrf, exact_match=chrf == 100)
            for chrf in (100, 60, 50, 70)
        ]
    )
    verdict, after = services.evaluate(after, NOW)
    assert verdict == Verdict.ROLLBACK
    assert "min_chrf = 70 (needs >= 80; from shadow (4 samples))" in after.reason
    decision = RolloutDecision.objects.filter(rollout=rollout).last()
    assert decision is not None and decision.numbers["quality"]["exact_match_rate"] == 0.25


def test_quality_gates_from_the_signed_off_offline_run(c: Canary) -> None:
    accepted_run(
        c.v2,
        samples=50,
        chrf=91.0,
        exact_match_rate=0.6,
        flips={"flip_rate": 0.08},
        distributions={"teacher_forced": {"mean_kl": 0.02}},
    )
    rollout = aged(start(c, gates={"max_flip_rate": 0.05, "max_kl": 0.1}), 120)
    healthy_traffic(c, rollout)
    verdict, after = services.evaluate(rollout, NOW)
    assert verdict == Verdict.ROLLBACK
    assert "max_flip_rate = 0.08 (needs <= 0.05; from offline (50 samples))" in after.reason
    assert "max_kl" not in after.reason.split("Gate failed:")[1]


# -- people's actions ----------------------------------------------------------------------------------------


def test_pause_resume_rollback_and_their_state_rules(c: Canary) -> None:
    rollout = start(c)
    with pytest.raises(services.RolloutStateError):
        services.resume(rollout, actor=None)
    paused = services.pause(rollout, actor=None)
    assert paused.state == "paused" and paused.share == 5.0
    resumed = services.resume(paused, actor=None)
    assert resumed.state == "running"
    rolled = services.rollback(resumed, actor=None, reason="bad answers seen by a person")
    assert (rolled.state, rolled.share, rolled.reason) == ("rolled_back", 0.0, "bad answers seen by a person")
    with pytest.raises(services.RolloutStateError):
        services.rollback(rolled, actor=None)
    with pytest.raises(services.RolloutStateError):
        services.promote(rolled, actor=None)
    assert history(rollout) == ["start", "pause", "resume", "rollback"]
    assert AuditEvent.objects.filter(object_type="routing.rollout", object_id=str(rollout.pk)).count() == 4


def test_a_verdict_for_a_step_that_moved_meanwhile_is_dropped(c: Canary) -> None:
    rollout = aged(start(c), 120)
    healthy_traffic(c, rollout)
    stale = Rollout.objects.get(pk=rollout.pk)
    services.evaluate(rollout, NOW)  # advances to step 2
    verdict, _ = services.evaluate(stale, NOW)  # the same tick's verdict for step 1, again
    assert verdict == Verdict.KEEP
    assert history(rollout) == ["start", "advance"]


def test_the_beat_task_evaluates_every_active_rollout(c: Canary) -> None:
    rollout = aged(start(c), 120)
    healthy_traffic(c, rollout)
    assert evaluate_rollouts_task() == {str(rollout.pk): "advance"}


# -- statistical gates (routing/rollouts/judge.py) -----------------------------------------------------------


def log_ttfts(c: Canary, rollout: Rollout, version: Any, ttfts: list[float]) -> None:
    for ttft in ttfts:
        log_requests(c.alias, version, 1, latency_ms=ttft * 5, ttft_ms=ttft, at=in_window(rollout))


def spread(n: int, median: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [median * rng.lognormvariate(0.0, 0.2) for _ in range(n)]


def test_a_statistical_gate_passes_an_identical_candidate_with_its_judgement(c: Canary) -> None:
    rollout = aged(start(c, gates={"ttft_tolerance": 0.05}), 120)
    log_ttfts(c, rollout, c.v1, spread(600, 40.0, 1))
    log_ttfts(c, rollout, c.v2, spread(300, 40.0, 2))
    verdict, after = services.evaluate(rollout, NOW)
    assert verdict == Verdict.ADVANCE and after.share == 25.0
    decision = RolloutDecision.objects.filter(rollout=rollout).last()
    assert decision is not None
    gate = decision.numbers["gates"]["ttft_tolerance"]
    assert gate["outcome"] == "Successful" and gate["passed"] is True
    j = gate["judgement"]
    assert (j["candidate_n"], j["baseline_n"]) == (300, 600)
    assert j["low"] <= gate["value"] <= j["high"] <= 0.05


def test_a_statistical_gate_rolls_back_a_slower_candidate(c: Canary) -> None:
    rollout = aged(start(c, gates={"ttft_tolerance": 0.05}), 120)
    log_ttfts(c, rollout, c.v1, spread(300, 40.0, 3))
    log_ttfts(c, rollout, c.v2, spread(100, 40.0 * 1.3, 4))
    verdict, after = services.evaluate(rollout, NOW)
    assert verdict == Verdict.ROLLBACK and after.state == "rolled_back"
    assert "Gate failed: ttft_tolerance" in after.reason and "Failed: shift +" in after.reason


def test_an_inconclusive_statistical_gate_holds_and_says_so(c: Canary) -> None:
    rollout = aged(start(c, gates={"ttft_tolerance": 0.02}), 120)
    log_ttfts(c, rollout, c.v1, spread(40, 40.0, 5))
    log_ttfts(c, rollout, c.v2, spread(25, 40.0, 6))
    verdict, after = services.evaluate(rollout, NOW)
    assert verdict == Verdict.HOLD and after.share == 5.0
    assert after.reason.startswith("Inconclusive, holding at 5%")
    decision = RolloutDecision.objects.filter(rollout=rollout).last()
    assert decision is not None and decision.numbers["gates"]["ttft_tolerance"]["outcome"] == "Inconclusive"
