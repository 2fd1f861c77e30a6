"""--sim-quality-drift F: a candidate departs from the same seed's reference as docs/simulator.md predicts.

Teacher-forced top-1 agreement is 1 - F and the mean KL about 1.2 x F nats; greedy outputs part at a
geometric position (mean (1 - F) / F); answers set from the reference's first token flip right->wrong at
about F, and from its second choice wrong->right at about F. All of it is deterministic, so the bounds
are loose only because they are predictions, not because the figures vary between runs.
"""

from __future__ import annotations

from typing import Any

from models_registry.evaluation.metrics import (
    KLMode,
    compare_distributions,
    first_divergence,
    listing_from_prompt_logprobs,
)
from tests.sim.conftest import MODEL, SimFactory
from tests.sim.http import call_json
from vllm_sim.testing import SimHandle

F = 0.2


def complete(sim: SimHandle, prompt: str | list[int], **params: Any) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": prompt, "temperature": 0, **params}
    status, resp = call_json(sim.base_url + "/v1/completions", body)
    assert status == 200, resp
    return dict(resp["choices"][0])


def test_teacher_forced_agreement_and_kl(sim: SimHandle, sim_factory: SimFactory) -> None:
    candidate = sim_factory("--max-model-len", "4096", "--sim-quality-drift", str(F))
    ref_lists: list[dict[str, float]] = []
    cand_lists: list[dict[str, float]] = []
    self_lists: list[dict[str, float]] = []
    for i in range(12):
        gen = complete(
            sim,
            f"Case {i}: describe a cache",
            max_tokens=100,
            ignore_eos=True,
            logprobs=5,
            return_token_ids=True,
        )
        text_ids = gen["prompt_token_ids"] + gen["token_ids"]
        start = len(gen["prompt_token_ids"])
        cand = complete(candidate, text_ids, max_tokens=1, prompt_logprobs=5)["prompt_logprobs"][start:]
        own = complete(sim, text_ids, max_tokens=1, prompt_logprobs=5)["prompt_logprobs"][start:]
        ref_lists += gen["logprobs"]["top_logprobs"]
        cand_lists += [listing_from_prompt_logprobs(e) for e in cand]
        self_lists += [listing_from_prompt_logprobs(e) for e in own]
    assert len(ref_lists) == 1200
    drifted = compare_distributions(ref_lists, cand_lists, KLMode.TEACHER_FORCED)
    itself = compare_distributions(ref_lists, self_lists, KLMode.TEACHER_FORCED)
    assert itself.top1_agreement == 1.0 and itself.mean_kl == 0.0
    assert drifted.top1_agreement is not None and drifted.mean_kl is not None
    assert abs((1 - drifted.top1_agreement) - F) < 0.04  # about F of the positions disagree
    assert 0.7 * F < drifted.mean_kl < 1.8 * F  # ~1.2 x F nats (top-5 listings)


def test_greedy_outputs_part_and_answers_flip_as_predicted(sim: SimHandle, sim_factory: SimFactory) -> None:
    candidate = sim_factory("--max-model-len", "4096", "--sim-quality-drift", str(F))
    cases = 100
    divergences = []
    right_to_wrong = wrong_to_right = 0
    for i in range(cases):
        prompt = f"Question {i}: name one thing"
        ref = complete(sim, prompt, max_tokens=60, ignore_eos=True, logprobs=2)["logprobs"]
        cand = complete(candidate, prompt, max_tokens=60, ignore_eos=True, logprobs=2)["logprobs"]
        # Until they part, both saw the same text, so both chose the same tokens.
        where = first_divergence(ref["tokens"], cand["tokens"])
        divergences.append(60 if where is None else where)
        if where is not None:
            assert ref["tokens"][:where] == cand["tokens"][:where]
        first_choice = ref["tokens"][0]
        second_choice = list(ref["top_logprobs"][0])[1]  # the reference's rank-2 token at position 0
        # Even cases expect the reference's first token, odd cases its second choice.
        expected = first_choice if i % 2 == 0 else second_choice
        ref_right = ref["tokens"][0] == expected
        cand_right = cand["tokens"][0] == expected
        right_to_wrong += ref_right and not cand_right
        wrong_to_right += cand_right and not ref_right
    mean_divergence = sum(divergences) / cases
    assert 2.5 < mean_divergence < 6.5  # geometric: (1 - F) / F = 4
    # Each half (50 cases) flips at about F: 10 expected each way.
    assert 4 <= right_to_wrong <= 17 and 4 <= wrong_to_right <= 17
