"""The demo's quantized engines answer like a quantized model, not a copy of the fp16 one (issue 34,
item 6): the AWQ demo deployments carry `--sim-quality-drift`, and simulators started with each demo
engine's own flags give different greedy answers and a teacher-forced KL above zero, so the shadow and
evaluation pages of `make run` have something to show."""

from __future__ import annotations

import json
import math
import urllib.request
from typing import Any

from nodes.demo import DEMO_AWQ_DRIFT, DEMO_ENGINES, demo_drift_args
from vllm_sim.testing import SimHandle, start_sim

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PROMPTS = [f"Tell me about item {i}." for i in range(20)]


def post(sim: SimHandle, path: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        sim.base_url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return dict(json.loads(resp.read()))


def demo_sim(version: str) -> SimHandle:
    engine = next(e for e in DEMO_ENGINES if e.version == version)
    return start_sim(
        MODEL,
        "--max-model-len",
        "4096",
        "--sim-profile",
        engine.sim_profile,
        *demo_drift_args(engine),
        time_scale=50.0,
    )


def test_the_demo_awq_engines_drift_from_fp16_and_it_shows() -> None:
    assert {tuple(demo_drift_args(e)) for e in DEMO_ENGINES if e.version == "fp16"} == {()}
    assert all(
        demo_drift_args(e) == ["--sim-quality-drift", str(DEMO_AWQ_DRIFT)]
        for e in DEMO_ENGINES
        if e.version == "awq"
    )
    fp16, awq = demo_sim("fp16"), demo_sim("awq")
    try:
        differing, kl, positions = 0, 0.0, 0
        for prompt in PROMPTS:
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 24, "temperature": 0, "seed": 0}
            ref = post(fp16, "/v1/completions", {**body, "return_token_ids": True})["choices"][0]
            cand = post(awq, "/v1/completions", body)["choices"][0]
            differing += ref["text"] != cand["text"]
            # Teacher forcing on the fp16 answer: each side's distribution at every position of it.
            forced = {
                "model": MODEL,
                "prompt": ref["prompt_token_ids"] + ref["token_ids"],
                "max_tokens": 1,
                "prompt_logprobs": 20,
            }
            start = len(ref["prompt_token_ids"])
            p_rows = post(fp16, "/v1/completions", forced)["choices"][0]["prompt_logprobs"][start:]
            q_rows = post(awq, "/v1/completions", forced)["choices"][0]["prompt_logprobs"][start:]
            for p_row, q_row in zip(p_rows, q_rows, strict=True):
                for tok, entry in p_row.items():
                    if tok in q_row:
                        lp = entry["logprob"]
                        kl += math.exp(lp) * (lp - q_row[tok]["logprob"])
                positions += 1
        assert differing >= 1, "every AWQ answer equals the fp16 one: the demo would show no drift"
        assert kl / positions > 0.005
    finally:
        fp16.stop()
        awq.stop()
