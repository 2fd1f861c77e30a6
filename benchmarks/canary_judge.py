"""How often the statistical canary judge is right, on TTFTs measured from the simulator (issue 34, item 5).

    .venv/bin/python benchmarks/canary_judge.py [--requests 1200] [--trials 100] [--tolerance 0.05]
                                                [--json var/bench/canary_judge.json]

Three simulator engines with the demo's fast profile (a10-llama3-8b-int4) at real timing
(`--sim-time-scale 1`): the baseline, an identical candidate (same flags, its own process), and a candidate
10 % slower (`--sim-time-scale 0.909`: every modelled duration x 1.1). Each gets `--requests` streamed chat
requests (prompts of 40 to 160 words by default, `--prompt-words`; 8 tokens out) at the same closed-loop
concurrency, all three at once, and the TTFT of each answer is kept as the client saw it (first content
chunk): the pools the trials draw from.

A trial is one canary of 3 steps (5 %, 25 %, 50 %) with the rollout defaults: the gate task judges a step
once it has `min_step_requests` = 100 candidate requests, the baseline having had the rest of the traffic
in the same window (1,900, 300, 100 requests); while the judgement is Inconclusive the window grows by
another 100 candidate requests (up to 5 times), as it does between gate-task runs. Samples are drawn
with replacement from the pools with the trial's seed. Counted over `--trials` seeded trials:

- slow candidate: Failed by the end of step 3 (target: every trial, i.e. within 3 steps);
- identical candidate: any step Failed (the false-failure rate, target <= 5 %), and all 3 steps
  Successful;
- a too-small sample (10 and 19 candidate requests, under the judge's minimum of 20; and 20-40, just
  over it): how often each outcome comes, for the slow candidate (target: never Successful below 20).

The ratios are from one run of the three engines side by side, so the machine's load hits all three.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from routing.rollouts import judge  # noqa: E402
from vllm_sim.testing import SimHandle, start_sim  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PROFILE = "a10-llama3-8b-int4"
STEPS = (5.0, 25.0, 50.0)
STEP_REQUESTS = 100  # Rollout.min_step_requests' default
MAX_GROWTH = 5


def has_text(line: bytes) -> bool:
    """A chunk that carries generated text (not the role-only first chunk, not the usage chunk)."""
    chunk = json.loads(line[len(b"data: ") :])
    return any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or [])


async def ttfts(sim: SimHandle, n: int, concurrency: int, seed: int, words: tuple[int, int]) -> list[float]:
    """TTFT (ms) of n streamed chat requests, `concurrency` at a time, prompts of varied length."""
    rng = random.Random(seed)
    prompts = [" ".join(["word"] * rng.randint(*words)) for _ in range(n)]
    out: list[float] = []
    queue = list(prompts)

    async def worker(session: aiohttp.ClientSession) -> None:
        while queue:
            prompt = queue.pop()
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 8,
                "stream": True,
            }
            start = time.perf_counter()
            async with session.post(sim.base_url + "/v1/chat/completions", json=body) as resp:
                first = None
                async for line in resp.content:
                    if first is None and line.startswith(b"data: {") and has_text(line):
                        first = time.perf_counter()
                if first is not None:
                    out.append((first - start) * 1000)

    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return out


async def collect(
    sims: dict[str, SimHandle], n: int, concurrency: int, words: tuple[int, int]
) -> dict[str, list[float]]:
    names = list(sims)
    results = await asyncio.gather(*(ttfts(sims[k], n, concurrency, i, words) for i, k in enumerate(names)))
    return dict(zip(names, results, strict=True))


def step_outcome(
    rng: random.Random, candidate: list[float], baseline: list[float], share: float, tolerance: float
) -> tuple[str, int]:
    """One step's final judgement and the candidate requests it took (the window grows while Inconclusive)."""
    outcome, n = judge.INCONCLUSIVE, 0
    for growth in range(1, MAX_GROWTH + 1):
        n = STEP_REQUESTS * growth
        m = round(n * (100 - share) / share)
        c = rng.choices(candidate, k=n)
        b = rng.choices(baseline, k=m)
        outcome = judge.compare_shift(c, b, tolerance).outcome
        if outcome != judge.INCONCLUSIVE:
            break
    return outcome, n


def canary(
    seed: int, candidate: list[float], baseline: list[float], tolerance: float
) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    results = []
    for share in STEPS:
        outcome, n = step_outcome(rng, candidate, baseline, share, tolerance)
        results.append((outcome, n))
        if outcome == judge.FAILED:
            break
    return results


def small_samples(
    candidate: list[float], baseline: list[float], tolerance: float, trials: int, n: int
) -> dict[str, float]:
    counts = {judge.SUCCESSFUL: 0, judge.FAILED: 0, judge.INCONCLUSIVE: 0}
    for seed in range(trials):
        rng = random.Random(10_000 + seed)
        j = judge.compare_shift(rng.choices(candidate, k=n), rng.choices(baseline, k=19 * n), tolerance)
        counts[j.outcome] += 1
    return {k: v / trials for k, v in counts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=1200, help="TTFTs measured per engine")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument(
        "--prompt-words", default="40,160", help="prompt length range in words (min,max): the TTFT spread"
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    lo, hi = (int(x) for x in args.prompt_words.split(","))

    flags = ("--max-model-len", "8192", "--sim-profile", PROFILE)
    sims = {
        "baseline": start_sim(MODEL, *flags, time_scale=1.0),
        "identical": start_sim(MODEL, *flags, time_scale=1.0),
        "slow": start_sim(MODEL, *flags, time_scale=1 / 1.1),
    }
    try:
        started = time.perf_counter()
        pools = asyncio.run(collect(sims, args.requests, args.concurrency, (lo, hi)))
        collect_s = time.perf_counter() - started
    finally:
        for sim in sims.values():
            sim.stop()

    base = pools["baseline"]
    medians = {k: statistics.median(v) for k, v in pools.items()}
    slow_runs = [canary(s, pools["slow"], base, args.tolerance) for s in range(args.trials)]
    same_runs = [canary(s, pools["identical"], base, args.tolerance) for s in range(args.trials)]

    def failed_by(runs: list[list[tuple[str, int]]], steps: int) -> float:
        return sum(any(o == judge.FAILED for o, _ in r[:steps]) for r in runs) / len(runs)

    first_fail_step = [
        next(i + 1 for i, (o, _) in enumerate(r) if o == judge.FAILED)
        for r in slow_runs
        if any(o == judge.FAILED for o, _ in r)
    ]
    result: dict[str, Any] = {
        "requests_per_engine": {k: len(v) for k, v in pools.items()},
        "collect_seconds": round(collect_s, 1),
        "prompt_words": [lo, hi],
        "ttft_median_ms": {k: round(v, 2) for k, v in medians.items()},
        # The spread the judge works against: p10 and p90 of each pool.
        "ttft_p10_p90_ms": {
            k: [round(q[0], 2), round(q[-1], 2)]
            for k, v in pools.items()
            for q in [statistics.quantiles(v, n=10)]
        },
        "observed_slow_shift": round(medians["slow"] / medians["baseline"] - 1, 4),
        "observed_identical_shift": round(medians["identical"] / medians["baseline"] - 1, 4),
        "tolerance": args.tolerance,
        "trials": args.trials,
        "slow_failed_within_3_steps": failed_by(slow_runs, 3),
        "slow_failed_at_step_1": failed_by(slow_runs, 1),
        "slow_first_failure_step_median": statistics.median(first_fail_step) if first_fail_step else None,
        "identical_false_failure_rate": failed_by(same_runs, 3),
        "identical_all_steps_successful": sum(
            len(r) == 3 and all(o == judge.SUCCESSFUL for o, _ in r) for r in same_runs
        )
        / args.trials,
        "identical_candidate_requests_per_step_median": statistics.median(n for r in same_runs for _, n in r),
        "small_sample_slow": {
            str(n): small_samples(pools["slow"], base, args.tolerance, args.trials, n)
            for n in (10, 19, 20, 40)
        },
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
