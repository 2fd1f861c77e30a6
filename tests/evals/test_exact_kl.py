"""Whole-vocabulary teacher-forced KL against two simulator engines (issue 34, item 1).

With `--max-logprobs -1` (vLLM's switch for whole-vocabulary logprobs) and EVAL_KL_TOP_K = 1,000 both
sides list more than the simulator's 280 output pieces that carry its mass: the run says
`full_vocabulary`, and its KL equals the one computed independently from the simulator's model
(vllm_sim.model: the distributions the engines sample from, no HTTP, no listings). With vLLM's default
`--max-logprobs 20` the engines refuse 1,000; the runner asks again with the k they name, and the run
says `top_k` with k = 20.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from models_registry.evaluation.models import EvalRun, RunState
from models_registry.evaluation.runner import execute_run
from tests.evals.run_helpers import DRIFT, answer_suite, chat, make_run
from vllm_sim import model
from vllm_sim.testing import SimHandle

pytestmark = [pytest.mark.django_db(transaction=False), pytest.mark.usefixtures("redis_clean")]

CASES = 8


def model_kl(reference: SimHandle, run: EvalRun) -> tuple[float, int]:
    """Σ KL and positions over the run's samples, from the simulator's model directly: the reference's
    prompt and output token ids (asked of it again, greedy is deterministic), the context hash before
    each output token, and KL(P || Q) over the whole output vocabulary at drift 0 and DRIFT."""
    total, positions = 0.0, 0
    for sample in run.samples.order_by("position"):
        answer = chat(reference, sample.case.prompt, return_token_ids=True)
        out_ids = answer["choices"][0]["token_ids"]
        assert answer["choices"][0]["message"]["content"] == sample.reference_output
        ids = list(answer["prompt_token_ids"]) + list(out_ids)
        hashes = list(model.contexts(ids))[len(ids) - len(out_ids) :]
        for h in hashes:
            p, q = model.distribution(h, 0.0), model.distribution(h, DRIFT)
            for idx in range(model.V):
                lp = p.logprob(idx)
                total += math.exp(lp) * (lp - q.logprob(idx))
        positions += len(hashes)
    return total, positions


def test_whole_vocabulary_listings_give_the_exact_kl(
    whole_reference: SimHandle, whole_candidate: SimHandle, settings: Any
) -> None:
    settings.EVAL_KL_TOP_K = 1000
    version = answer_suite(whole_reference, CASES, name="exact-kl")
    run = make_run(version, whole_reference, whole_candidate)
    assert execute_run(run.pk) is not None
    run.refresh_from_db()
    assert run.state == RunState.COMPLETED and run.error_count == 0
    forced = run.summary["distributions"]["teacher_forced"]
    assert forced["method"] == "full_vocabulary" and forced["k"] == 1000
    assert forced["keys"] == "token_ids"  # prompt_logprobs on both sides, compared by token id
    assert forced["tail_mass_max"] < 1e-3
    kl_sum, positions = model_kl(whole_reference, run)
    assert positions == forced["positions"]
    assert forced["mean_kl"] == pytest.approx(kl_sum / positions, rel=1e-6)
    assert forced["mean_kl"] > 0.01  # the drifted twin differs, so the check above can fail
    low, high = forced["kl_ci"]
    assert low <= forced["mean_kl"] <= high
    assert forced["kl_quantiles"]["max"] >= forced["kl_quantiles"]["p99"] >= forced["kl_quantiles"]["p50"]
    assert forced["perplexity_ratio"] > 1.0  # the drifted side finds the reference's text less likely


def test_an_engine_that_caps_logprobs_is_asked_again_with_its_cap(
    reference_sim: SimHandle, drifted_sim: SimHandle, settings: Any
) -> None:
    settings.EVAL_KL_TOP_K = 1000
    version = answer_suite(reference_sim, 4, name="capped-kl")
    run = make_run(version, reference_sim, drifted_sim)
    assert execute_run(run.pk) is not None
    run.refresh_from_db()
    assert run.state == RunState.COMPLETED and run.error_count == 0
    assert run.teacher_forcing_note == ""  # the refusal of -1 did not turn teacher forcing off
    forced = run.summary["distributions"]["teacher_forced"]
    # vLLM's default --max-logprobs 20: "... greater than max allowed: 20", so both sides list 20.
    assert forced["k"] == 20 and forced["method"] == "top_k"
    assert forced["tail_mass_max"] > 1e-3
    assert forced["samples"] == 4
