"""Two simulator engines (a reference and its drifted twin) and suites whose answers come from the reference.

The simulator writes pseudo-text, so a suite's expected answers are set from what the reference writes:
even cases expect the reference's own first token (the reference is right; the candidate flips
right->wrong where its first token differs), odd cases expect the reference's second choice at the
first position (the reference is wrong; the candidate flips wrong->right where drift swapped its top-1).
"""

from __future__ import annotations

import json
import re
import urllib.request
from typing import Any

from models_registry.evaluation.models import EvalRun, EvalSuite, EvalSuiteVersion
from models_registry.evaluation.suites import import_jsonl
from vllm_sim.testing import SimHandle

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DRIFT = 0.2
MAX_TOKENS = 24


def chat(sim: SimHandle, prompt: str, **params: Any) -> dict[str, Any]:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "seed": 0,
        "max_tokens": MAX_TOKENS,
        **params,
    }
    req = urllib.request.Request(
        sim.base_url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return dict(json.loads(resp.read()))


def answer_suite(reference: SimHandle, cases: int, name: str = "sim-answers") -> EvalSuiteVersion:
    """A suite version of `cases` prompts whose expected answers are set from the reference (see above)."""
    lines = []
    for i in range(cases):
        prompt = f"Question {i}: name one thing"
        first = chat(reference, prompt, logprobs=True, top_logprobs=2)["choices"][0]["logprobs"]["content"][0]
        token = first["token"] if i % 2 == 0 else first["top_logprobs"][1]["token"]
        lines.append(
            {
                "id": f"q{i}",
                "prompt": prompt,
                "expected": r"\A" + re.escape(token),
                "match_rule": "regex",
                "tags": ["even" if i % 2 == 0 else "odd"],
            }
        )
    suite = EvalSuite.objects.create(name=name)
    return import_jsonl(suite, "\n".join(json.dumps(line) for line in lines))


def make_run(version: EvalSuiteVersion, reference: SimHandle, candidate: SimHandle, **fields: Any) -> EvalRun:
    version.lock()
    return EvalRun.objects.create(
        suite_version=version,
        reference_base_url=reference.base_url,
        reference_model=MODEL,
        candidate_base_url=candidate.base_url,
        candidate_model=MODEL,
        max_tokens=MAX_TOKENS,
        case_count=version.cases.count(),
        **fields,
    )
