"""Output text is a function of (prompt, seed), the same in every process."""

from __future__ import annotations

from typing import Any

from tests.sim.conftest import MODEL, SimFactory
from tests.sim.http import call_json
from vllm_sim.testing import SimHandle


def complete(sim: SimHandle, prompt: str, **params: Any) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 64, "ignore_eos": True, **params}
    status, resp = call_json(sim.base_url + "/v1/completions", body)
    assert status == 200, resp
    return dict(resp)


def texts(sim: SimHandle, prompt: str, **params: Any) -> str:
    return str(complete(sim, prompt, **params)["choices"][0]["text"])


def test_same_prompt_and_seed_give_the_same_text(sim: SimHandle) -> None:
    a = texts(sim, "The capital of France is", seed=7)
    assert a == texts(sim, "The capital of France is", seed=7)
    assert a != texts(sim, "The capital of France is", seed=8)
    assert a != texts(sim, "The capital of Spain is", seed=7)


def test_greedy_decoding_ignores_the_seed(sim: SimHandle) -> None:
    a = texts(sim, "Explain KV caches", temperature=0, seed=1)
    assert a == texts(sim, "Explain KV caches", temperature=0, seed=2)
    assert a == texts(sim, "Explain KV caches", temperature=0)


def test_unseeded_sampling_varies_between_requests(sim: SimHandle) -> None:
    assert texts(sim, "Tell me a story") != texts(sim, "Tell me a story")


def test_same_text_across_processes(sim: SimHandle, sim_factory: SimFactory) -> None:
    other = sim_factory("--max-model-len", "4096", "--sim-profile", "a10-llama3-8b-int4")
    assert texts(sim, "Reproducible?", seed=3) == texts(other, "Reproducible?", seed=3)


def test_n_choices_differ_under_sampling(sim: SimHandle) -> None:
    resp = complete(sim, "Pick a word", n=3, seed=11)
    outs = [c["text"] for c in resp["choices"]]
    assert [c["index"] for c in resp["choices"]] == [0, 1, 2]
    assert len(set(outs)) == 3
    assert resp["usage"]["completion_tokens"] == 3 * 64


def test_a_drifted_engine_is_itself_deterministic(sim_factory: SimFactory) -> None:
    # How far a drifted twin departs from the reference is tested in test_quality_drift.py.
    drifted = sim_factory("--max-model-len", "4096", "--sim-quality-drift", "0.2")
    assert texts(drifted, "again", temperature=0) == texts(drifted, "again", temperature=0)
