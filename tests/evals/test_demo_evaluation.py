"""`make run`'s seed leaves a finished evaluation run (a simulator against its drifted twin, run by the
real runner) so the Evaluations page is never empty; seeding again does not add a second one."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from inferchain.management.commands import seed_demo
from models_registry.evaluation.models import EvalRun, EvalSample
from nodes.demo import DEMO_EVAL_RUN

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_clean"), pytest.mark.timeout(300)]


def seed() -> str:
    out = StringIO()
    call_command("seed_demo", stdout=out)
    return out.getvalue()


def test_seed_runs_a_simulated_pair_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Users, keys and the evaluation are this test's business; the fleet and routing seeds are others'.
    monkeypatch.setattr(seed_demo.Command, "extra_seed", lambda self: None)
    first = seed()
    [run] = EvalRun.objects.all()
    assert run.name == DEMO_EVAL_RUN and run.state == "completed"
    assert f"evaluation run {run.pk}" in first
    assert run.suite_version.suite.name == "basic-facts"
    cases = run.suite_version.cases.count()
    assert cases == 40 and run.done_count == cases and run.error_count == 0
    assert EvalSample.objects.filter(run=run).count() == cases
    # Real runner output: the drifted twin parts from the reference somewhere, and the teacher-forced
    # KL (the simulator answers prompt_logprobs) sees it; the reference's side of each case is stored.
    s = run.summary
    assert s["samples"] == cases and 0 < s["exact_match_rate"] < 1 and 0 < s["token_agreement"] < 1
    forced = s["distributions"]["teacher_forced"]
    assert forced["samples"] == cases and forced["mean_kl"] > 0 and forced["top1_agreement"] < 1
    assert run.teacher_forcing_note == ""
    assert all(x.reference_output and x.reference_tokens for x in run.samples.all())
    assert run.samples.filter(exact_match=False, first_divergence__isnull=False).exists()
    assert s["flips"]["n"] == cases  # every shipped case has an answer (the simulator gets them wrong)
    assert "--sim-quality-drift" in run.candidate_info["launch_argv"]
    assert "--sim-quality-drift" not in run.reference_info["launch_argv"]

    second = seed()
    assert EvalRun.objects.count() == 1 and EvalSample.objects.count() == cases
    assert "evaluation run" not in second
