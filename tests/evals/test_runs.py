"""Evaluation runs against two real simulator engines: metrics, resumption, cancel, one worker at a time.

The database is the real PostgreSQL and the lock and live pushes use the real Redis; the task's body
(runner.execute_run) is called directly, as a Celery worker would.
"""

from __future__ import annotations

from typing import Any

import pytest

from core.redis_client import get_redis, key
from models_registry.evaluation.models import EvalRun, EvalSample, RunState
from models_registry.evaluation.runner import execute_run
from models_registry.tasks import run_evaluation
from nodes.sim.testing import SimHandle
from tests.evals.run_helpers import answer_suite, make_run

pytestmark = [pytest.mark.django_db(transaction=False), pytest.mark.usefixtures("redis_clean")]

CASES = 40


class WorkerKilled(BaseException):
    """Stands for a worker process dying midway (raised from inside the run loop)."""


def test_reference_against_itself_agrees_everywhere(reference_sim: SimHandle) -> None:
    version = answer_suite(reference_sim, CASES)
    run = make_run(version, reference_sim, reference_sim)
    assert run_evaluation(run.pk) == RunState.COMPLETED
    run.refresh_from_db()
    assert (run.done_count, run.error_count, run.attempts) == (CASES, 0, 1)
    s = run.summary
    assert s["samples"] == CASES and s["exact_match_rate"] == 1.0 and s["chrf"] == 100.0
    flips = s["flips"]
    assert flips["flips"] == 0 and flips["reference_accuracy"] == 0.5 and flips["accuracy_difference"] == 0.0
    forced = s["distributions"]["teacher_forced"]
    assert forced["mean_kl"] == 0.0 and forced["top1_agreement"] == 1.0 and forced["samples"] == CASES
    assert run.teacher_forcing_note == ""
    for side in ("reference", "candidate"):
        assert s[side]["latency_ms"]["p50"] > 0 and s[side]["tokens_per_s"]["mean"] > 0
    samples = list(run.samples.all())
    assert len(samples) == CASES
    assert all(x.first_divergence is None and x.flip == "" and x.kl_mode == "teacher_forced" for x in samples)
    assert all(len(x.reference_tokens) == len(x.reference_token_logprobs) > 0 for x in samples)


def test_drifted_candidate_flips_and_diverges(reference_sim: SimHandle, drifted_sim: SimHandle) -> None:
    version = answer_suite(reference_sim, CASES)
    run = make_run(version, reference_sim, drifted_sim)
    assert execute_run(run.pk) is not None
    run.refresh_from_db()
    assert run.state == RunState.COMPLETED and run.done_count == CASES
    s = run.summary
    flips = s["flips"]
    # The reference is right on the even half exactly (its own first token), wrong on the odd half.
    assert flips["reference_accuracy"] == 0.5 and flips["n"] == CASES
    assert flips["right_to_wrong"] >= 1 and flips["wrong_to_right"] >= 1  # ~F of each half: 4 expected
    assert flips["flips"] <= 20
    low, high = flips["difference_ci"]
    assert low <= flips["accuracy_difference"] <= high
    forced = s["distributions"]["teacher_forced"]
    assert 0.05 < forced["mean_kl"] < 0.6  # ~1.25 x F nats
    assert 0.6 < forced["top1_agreement"] < 0.95  # ~1 - F
    assert s["exact_match_rate"] < 1.0 and s["chrf"] < 100.0
    # Each flip is where the sample says: right->wrong only on even cases, wrong->right only on odd ones.
    for sample in run.samples.exclude(flip=""):
        assert sample.tags == (["even"] if sample.flip == "right_to_wrong" else ["odd"])
        assert sample.first_divergence == 0
    differing = run.samples.filter(exact_match=False)
    assert differing.exists() and all(x.first_divergence is not None for x in differing)
    assert all(
        x.mean_kl is not None and len(x.position_kl) == len(x.reference_tokens) for x in run.samples.all()
    )


def test_a_killed_worker_resumes_with_only_the_missing_cases(
    reference_sim: SimHandle, drifted_sim: SimHandle
) -> None:
    version = answer_suite(reference_sim, CASES)
    run = make_run(version, reference_sim, drifted_sim, concurrency=4)
    stored: list[int] = []

    def die_after_ten(sample: EvalSample) -> None:
        stored.append(sample.case_id)
        if len(stored) == 10:
            raise WorkerKilled

    with pytest.raises(WorkerKilled):
        execute_run(run.pk, after_sample=die_after_ten)
    run.refresh_from_db()
    assert run.state == RunState.RUNNING and run.samples.count() == 10
    # Two samples of the dead worker are lost as well (e.g. its transaction never committed).
    lost = list(run.samples.order_by("position")[:2].values_list("case_id", flat=True))
    run.samples.filter(case_id__in=lost).delete()

    again: list[int] = []
    execute_run(run.pk, after_sample=lambda s: again.append(s.case_id))
    run.refresh_from_db()
    assert run.state == RunState.COMPLETED and run.attempts == 2
    assert len(again) == CASES - 8 and set(lost) <= set(again)
    assert not set(again) & (set(stored) - set(lost))  # nothing that was kept ran twice
    case_ids = list(run.samples.values_list("case_id", flat=True))
    assert len(case_ids) == len(set(case_ids)) == CASES == run.done_count
    # A third delivery of the task finds the run finished and does nothing.
    assert run_evaluation(run.pk) == RunState.COMPLETED
    assert EvalRun.objects.get(pk=run.pk).attempts == 2


def test_a_second_delivery_while_a_worker_holds_the_run_does_nothing(
    reference_sim: SimHandle,
) -> None:
    version = answer_suite(reference_sim, 4)
    run = make_run(version, reference_sim, reference_sim)
    lock = get_redis().lock(key("eval", "run", str(run.pk)), timeout=30)
    assert lock.acquire(blocking=False)
    try:
        assert execute_run(run.pk) is None
    finally:
        lock.release()
    run.refresh_from_db()
    assert run.state == RunState.PENDING and run.samples.count() == 0


def test_cancel_between_cases(reference_sim: SimHandle, drifted_sim: SimHandle) -> None:
    version = answer_suite(reference_sim, CASES)
    run = make_run(version, reference_sim, drifted_sim, concurrency=2)
    seen: list[Any] = []

    def cancel_after_three(sample: EvalSample) -> None:
        seen.append(sample)
        if len(seen) == 3:
            EvalRun.objects.filter(pk=run.pk).update(cancel_requested=True)

    execute_run(run.pk, after_sample=cancel_after_three)
    run.refresh_from_db()
    assert run.state == RunState.CANCELLED and run.finished_at is not None
    assert run.samples.count() == 3 == run.done_count
    assert run.summary["samples"] == 3
    # A cancelled run stays cancelled when its task is delivered again.
    assert run_evaluation(run.pk) == RunState.CANCELLED
    assert run.samples.count() == 3


def test_cancelled_before_start_runs_nothing(reference_sim: SimHandle) -> None:
    version = answer_suite(reference_sim, 4)
    run = make_run(version, reference_sim, reference_sim, cancel_requested=True)
    assert run_evaluation(run.pk) == RunState.CANCELLED
    assert EvalSample.objects.filter(run=run).count() == 0


def test_an_unreachable_side_is_stored_as_errors_not_lost(reference_sim: SimHandle) -> None:
    version = answer_suite(reference_sim, 3)
    run = make_run(version, reference_sim, reference_sim)
    EvalRun.objects.filter(pk=run.pk).update(candidate_base_url="http://127.0.0.1:9", request_timeout=2)
    assert run_evaluation(run.pk) == RunState.COMPLETED
    run.refresh_from_db()
    assert run.error_count == 3 == run.summary["errors"] and run.summary["samples"] == 0
    assert all("ClientConnectorError" in s.error for s in run.samples.all())
