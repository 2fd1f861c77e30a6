"""A finished run made through the ORM, without engines: hand-written outputs scored by the real metrics.

The review, sign-off, export and role tests need a run with samples but not the engines that made them;
these build one in milliseconds. Outputs (tokens with their log-probabilities):

    q0  "Paris"       both right, identical                         -> exact match
    q1  "4" / "5"     right -> wrong, parting at token 0            -> flip right_to_wrong
    q2  "Blue sky" / "Blue sea"   no expected answer, part at 1     -> differs
"""

from __future__ import annotations

import json
import math
from typing import Any

from models_registry.evaluation.metrics import KLMode, SideOutput, compare_distributions, score_sample
from models_registry.evaluation.models import EvalRun, EvalSample, EvalSuite, RunState
from models_registry.evaluation.runner import run_summary
from models_registry.evaluation.suites import import_jsonl
from models_registry.models import Model, ModelVersion

CASES: list[dict[str, Any]] = [
    {
        "id": "q0",
        "prompt": "Capital of France?",
        "expected": "Paris",
        "match_rule": "normalized",
        "tags": ["geo"],
    },
    {"id": "q1", "prompt": "2+2?", "expected": "4", "match_rule": "numeric", "tags": ["math"]},
    {"id": "q2", "prompt": "Say something about the sky.", "tags": ["free"]},
]
# (reference tokens, candidate tokens); one log-probability per token, and top-2 listings per position.
OUTPUTS = {
    "q0": (["Paris"], ["Paris"]),
    "q1": (["4"], ["5"]),
    "q2": (["Blue", " sky"], ["Blue", " sea"]),
}


def listing(token: str, other: str, p: float) -> dict[str, float]:
    return {token: math.log(p), other: math.log(1 - p)}


def version_pair(name: str = "review-model") -> tuple[ModelVersion, ModelVersion]:
    """A full-precision version and the quantized child the run's candidate serves."""
    model = Model.objects.create(name=name)
    parent = ModelVersion.objects.create(
        model=model, revision="fp16", source_kind="directory", source_path="/m/a"
    )
    child = ModelVersion.objects.create(
        model=model, revision="q4", source_kind="directory", source_path="/m/b", parent=parent
    )
    return parent, child


def side_info(version: ModelVersion) -> dict[str, Any]:
    """The part of a deployment's snapshot (nodes.evaluation) that names its model version."""
    return {"model_version_id": version.pk, "model": version.model.name, "revision": version.revision}


def finished_run(
    *,
    candidate: ModelVersion | None = None,
    state: str = RunState.COMPLETED,
    error_case: bool = False,
    suite_name: str = "review-suite",
    **fields: Any,
) -> EvalRun:
    """A run in `state` with one scored sample per case of CASES (plus a failed one when error_case)."""
    cases = [*CASES, {"id": "q3", "prompt": "Unreachable?"}] if error_case else CASES
    version = import_jsonl(EvalSuite.objects.create(name=suite_name), "\n".join(json.dumps(c) for c in cases))
    version.lock()
    run = EvalRun.objects.create(
        name=fields.pop("name", "review run"),
        suite_version=version,
        reference_base_url="http://127.0.0.1:9",
        reference_model="ref",
        reference_info=side_info(candidate.parent) if candidate and candidate.parent else {},
        candidate_base_url="http://127.0.0.1:9",
        candidate_model="cand",
        candidate_info=side_info(candidate) if candidate else {},
        state=state,
        case_count=len(cases),
        **fields,
    )
    by_id = {c.case_id: c for c in version.cases.all()}
    for position, spec in enumerate(cases):
        case = by_id[spec["id"]]
        sample = EvalSample(
            run=run, case=case, case_key=case.case_id, position=position, tags=spec.get("tags", [])
        )
        if spec["id"] not in OUTPUTS:
            sample.error = "/v1/chat/completions: ClientConnectorError"
            sample.save()
            continue
        ref_tokens, cand_tokens = OUTPUTS[spec["id"]]
        ref_listings = [listing(t, "x", 0.9) for t in ref_tokens]
        forced = [listing(t, "x", 0.6) for t in ref_tokens]
        ref = SideOutput(text="".join(ref_tokens), tokens=ref_tokens, top_logprobs=ref_listings)
        cand = SideOutput(text="".join(cand_tokens), tokens=cand_tokens, top_logprobs=None)
        score = score_sample(
            ref,
            cand,
            expected=case.expected,
            match_rule=case.match_rule or None,
            candidate_scored_reference=forced,
        )
        sample.reference_output, sample.candidate_output = ref.text, cand.text
        sample.reference_tokens, sample.candidate_tokens = ref_tokens, cand_tokens
        sample.reference_token_logprobs = [-0.1] * len(ref_tokens)
        sample.candidate_token_logprobs = [-0.5] * len(cand_tokens)
        sample.position_kl = compare_distributions(ref_listings, forced, KLMode.TEACHER_FORCED).kl
        for name in (
            "exact_match",
            "first_divergence",
            "token_agreement",
            "chrf",
            "reference_correct",
            "candidate_correct",
            "mean_kl",
            "max_kl",
            "top1_agreement",
        ):
            setattr(sample, name, score[name])
        sample.flip = score["flip"] or ""
        sample.kl_mode = score["kl_mode"] or ""
        sample.scores = score
        sample.reference_latency_ms, sample.candidate_latency_ms = 120.0, 80.0
        sample.reference_tokens_per_s, sample.candidate_tokens_per_s = 40.0, 60.0
        sample.save()
    run.done_count = run.samples.count()
    run.error_count = run.samples.exclude(error="").count()
    run.summary = run_summary(run)
    run.save(update_fields=["done_count", "error_count", "summary"])
    return run
