"""Greedy means greedy on every engine kind (docs/evaluations.md, "Greedy, per engine").

Against a real llama.cpp engine (llama-cpp-python's server on the SmolLM2 GGUF): `temperature: 0` alone
is not greedy there, its default repeat penalty of 1.1 changes outputs that repeat themselves; the run's
generation (runner.generate, with what EvalRun.greedy gives a llama.cpp side) must equal the engine's
answer with every penalty neutral, on prompts long enough to repeat, and the test first shows that the
engine's defaults give another answer on them (else it would prove nothing).

One llama-cpp-python server is not history-free: it keeps the previous prompt's KV cache and evaluates
only the part of a new prompt past the common prefix, and that changes the logits enough to flip a close
argmax (measured: the same request gave "apple_apple_..." fresh and "apple: 1234..." when sent again).
So every compared call here follows the same unrelated request, and all start from the same cache."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import urllib.request
from typing import Any

import aiohttp
import pytest

from models_registry.evaluation.endpoints import deployment_endpoint
from models_registry.evaluation.models import GREEDY_LLAMACPP, GREEDY_VLLM, EvalRun, greedy_params
from models_registry.evaluation.runner import Generation, RunParams, generate
from nodes.models import Deployment
from tests.routing.test_llamacpp_engine import llama_engine  # noqa: F401 (a fixture)

PROMPTS = [
    "Count from 1 to 30, one number per line.",
    "Write the word 'apple' twenty times, separated by commas.",
    "List the days of the week, then list them again, three times in all.",
]
MAX_TOKENS = 48


def post(dep: Deployment, path: str, body: dict[str, Any]) -> dict[str, Any]:
    ep = deployment_endpoint(dep.pk)
    request = urllib.request.Request(
        ep.base_url + path,
        data=json.dumps({"model": ep.model, **body}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {ep.api_key}"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return dict(json.loads(response.read()))


def same_cache(dep: Deployment) -> None:
    """One short unrelated request: the next call starts from this prompt's cache, whatever came before."""
    post(dep, "/v1/completions", {"prompt": "Hi", "max_tokens": 1})


def raw_chat(dep: Deployment, prompt: str, **sampling: Any) -> str:
    same_cache(dep)
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS, **sampling}
    return str(post(dep, "/v1/chat/completions", body)["choices"][0]["message"]["content"])


def run_generation(dep: Deployment, prompt: str) -> Generation:
    """What a run's generation sends to a llama.cpp side (its greedy from the recorded engine kind)."""
    same_cache(dep)
    ep = dataclasses.replace(deployment_endpoint(dep.pk), greedy=greedy_params(dep.engine))
    params = RunParams(seed=0, max_tokens=MAX_TOKENS, top_logprobs=0, concurrency=1, timeout=120.0)

    async def once() -> Generation:
        async with aiohttp.ClientSession() as session:
            return await generate(session, ep, params, [{"role": "user", "content": prompt}])

    return asyncio.run(once())


@pytest.mark.llama
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_runs_greedy_generation_on_llama_cpp_is_the_penalty_free_argmax(
    llama_engine: Deployment,  # noqa: F811
) -> None:
    assert llama_engine.engine == "llamacpp"
    changed = 0
    for prompt in PROMPTS:
        neutral = raw_chat(llama_engine, prompt, **GREEDY_LLAMACPP)
        defaults = raw_chat(llama_engine, prompt, temperature=0)
        changed += neutral != defaults
        assert run_generation(llama_engine, prompt).text == neutral, prompt
    # The prompts repeat enough for llama.cpp's default repeat penalty to change the answer.
    assert changed >= 1, "no prompt told the penalty-free answer from llama.cpp's default one"


def test_each_engine_kind_gets_its_own_greedy() -> None:
    assert greedy_params("llamacpp") == GREEDY_LLAMACPP and GREEDY_LLAMACPP["repeat_penalty"] == 1.0
    for kind in ("vllm", "sim", "unknown", None):
        assert greedy_params(kind) == GREEDY_VLLM and GREEDY_VLLM["repetition_penalty"] == 1.0
    run = EvalRun(reference_info={"engine": "sim"}, candidate_info={"engine": "llamacpp"}, seed=3)
    assert run.sampling()["greedy"] == {"reference": GREEDY_VLLM, "candidate": GREEDY_LLAMACPP}
    # What a run recorded when it was created is what it says it sent, whatever the tables say now.
    older = EvalRun(reference_info={"engine": "vllm", "greedy": {"temperature": 0}}, candidate_info={})
    assert older.greedy("reference") == {"temperature": 0}
    # Shown in one order whatever order the stored JSON came back in (jsonb reorders keys).
    shuffled = EvalRun(
        reference_info={"greedy": dict(reversed(list(GREEDY_VLLM.items())))}, candidate_info={}
    )
    assert list(shuffled.greedy("reference"))[:2] == ["temperature", "top_p"]
