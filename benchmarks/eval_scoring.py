"""Scoring cost per evaluation sample: everything after both outputs arrive (docs/evaluations.md).

One command:

    .venv/bin/python benchmarks/eval_scoring.py

    .venv/bin/python benchmarks/eval_scoring.py --top-k 1000   # the exact-KL setting

It scores --samples synthetic samples --reps times with `score_sample` and then summarizes them (KL
quantiles, bootstrap intervals, McNemar, per-tag tables), and prints the median per-sample cost over the
repetitions (target: under 5 ms). Each sample is a reference and a candidate output of --tokens tokens
that part half-way, an expected answer with the numeric rule, the generation's top-5 listings, and the
runner's teacher-forced path: both sides' distributions over the reference's tokens with --top-k
entries keyed by token id (EVAL_KL_TOP_K, default 20; 4 in 5 ids shared by the two sides), the most
expensive path: chrF plus a KL, Δp and perplexity terms per position.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models_registry.evaluation.metrics import SideOutput, score_sample, summarize

WORDS_TEXT = (
    "the of and to in is that it was for on are as with his they at be this from have or by one "
    "had not but what all were when we there can an your which their said if do will each about"
)
WORDS = WORDS_TEXT.split()


def distribution(rng: random.Random, chosen: str, k: int) -> dict[str, float]:
    """A top-k listing with `chosen` first: log-probabilities of a geometric-ish distribution."""
    others = rng.sample([w for w in WORDS if w != chosen], k - 1)
    weights = [0.6] + [0.4 * 0.5**i for i in range(1, k)]
    return {tok: math.log(w) for tok, w in zip([chosen, *others], weights, strict=True)}


VOCAB = 50_000  # token ids of the forced listings


def forced_pair(rng: random.Random, chosen: int, k: int) -> tuple[dict[int, float], dict[int, float]]:
    """The reference's and the candidate's listing at one position, keyed by id, `chosen` listed on both:
    k ids each, 4 in 5 of them shared, geometric-ish weights normalised over the listed ids."""
    ids = [chosen, *rng.sample(range(VOCAB), k - 1)]
    shared = ids[: max(1, k * 4 // 5)]
    cand_ids = shared + rng.sample(range(VOCAB), k - len(shared))

    def listing(keys: list[int]) -> dict[int, float]:
        weights = [0.6] + [0.4 * 0.9**i for i in range(1, len(keys))]
        total = sum(weights)
        return {tok: math.log(w / total) for tok, w in zip(keys, weights, strict=True)}

    return listing(ids), listing(cand_ids)


def make_sample(rng: random.Random, tokens: int, k: int) -> dict[str, object]:
    ref_tokens = [" " + rng.choice(WORDS) for _ in range(tokens)]
    cand_tokens = ref_tokens[: tokens // 2] + [" " + rng.choice(WORDS) for _ in range(tokens - tokens // 2)]
    ref_text = "".join(ref_tokens) + " so the answer is 42"
    cand_text = "".join(cand_tokens) + " so the answer is 41"
    ref_ids = [rng.randrange(VOCAB) for _ in ref_tokens]
    pairs = [forced_pair(rng, i, k) for i in ref_ids]
    return {
        "reference": SideOutput(ref_text, ref_tokens, [distribution(rng, t, 5) for t in ref_tokens]),
        "candidate": SideOutput(cand_text, cand_tokens, [distribution(rng, t, 5) for t in cand_tokens]),
        "reference_forced": [p for p, _ in pairs],
        "candidate_forced": [q for _, q in pairs],
        "ids": ref_ids,
        "tags": [rng.choice(["math", "chat", "code"])],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=128, help="output tokens per side")
    parser.add_argument("--top-k", type=int, default=20, help="forced listing entries per position")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    rng = random.Random(0)
    samples = [make_sample(rng, args.tokens, args.top_k) for _ in range(args.samples)]
    per_sample_ms = []
    for _ in range(args.reps):
        start = time.perf_counter()
        scores = [
            score_sample(
                s["reference"],  # type: ignore[arg-type]
                s["candidate"],  # type: ignore[arg-type]
                expected="42",
                match_rule="numeric",
                candidate_scored_reference=s["candidate_forced"],  # type: ignore[arg-type]
                reference_scored_reference=s["reference_forced"],  # type: ignore[arg-type]
                forced_tokens=s["ids"],  # type: ignore[arg-type]
                kl_k=args.top_k,
                keep_positions=True,
            )
            for s in samples
        ]
        kls = [score.pop("position_kl") for score in scores]
        summarize(scores, position_kl=kls, tags=[s["tags"] for s in samples])  # type: ignore[misc]
        per_sample_ms.append((time.perf_counter() - start) * 1000 / len(samples))
    result = {
        "samples": args.samples,
        "reps": args.reps,
        "tokens_per_side": args.tokens,
        "top_k": args.top_k,
        "median_ms_per_sample": round(statistics.median(per_sample_ms), 4),
        "min_ms_per_sample": round(min(per_sample_ms), 4),
        "max_ms_per_sample": round(max(per_sample_ms), 4),
        "target_ms": 5.0,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
