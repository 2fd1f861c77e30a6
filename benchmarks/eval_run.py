"""Wall time of a whole evaluation run: 500 cases against two simulator engines (docs/evaluations.md).

One command (a scratch test database on DATABASE_URL's server is created and dropped):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python benchmarks/eval_run.py

It starts a reference simulator and its twin with --sim-quality-drift 0.2 (real-time H100 timing
unless --time-scale), makes a suite of --cases prompts (half with a numeric expected answer), and runs
it --reps times with runner.execute_run, as the Celery task does: both sides generate with top-5
logprobs, the candidate scores the reference's tokens (teacher forcing), each sample is scored and
stored as it arrives. It prints the median wall time over the repetitions (target: under a minute)
and the run's summary figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inferchain.settings")

import django

django.setup()

from django.test.utils import setup_databases, teardown_databases  # noqa: E402

from models_registry.evaluation.models import EvalRun, EvalSuite, EvalSuiteVersion  # noqa: E402
from models_registry.evaluation.runner import execute_run  # noqa: E402
from models_registry.evaluation.suites import import_jsonl  # noqa: E402
from vllm_sim.testing import start_sim  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def make_suite(cases: int) -> EvalSuiteVersion:
    lines = []
    for i in range(cases):
        line: dict[str, object] = {"id": f"c{i}", "prompt": f"Case {i}: what is {i} + {i}? Explain briefly."}
        if i % 2 == 0:
            line.update(expected=str(2 * i), match_rule="numeric")
        lines.append(line)
    suite = EvalSuite.objects.create(name=f"bench-{time.time_ns()}")
    return import_jsonl(suite, "\n".join(json.dumps(x) for x in lines))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", type=int, default=500)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight per side")
    parser.add_argument("--top-logprobs", type=int, default=5)
    parser.add_argument("--time-scale", type=float, default=1.0, help="simulator speed (1 = real time)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    old_config = setup_databases(verbosity=0, interactive=False)
    reference = start_sim(MODEL, "--max-model-len", "4096", time_scale=args.time_scale)
    candidate = start_sim(
        MODEL, "--max-model-len", "4096", "--sim-quality-drift", "0.2", time_scale=args.time_scale
    )
    try:
        version = make_suite(args.cases)
        version.lock()
        walls: list[float] = []
        summary: dict[str, object] = {}
        for _ in range(args.reps):
            run = EvalRun.objects.create(
                suite_version=version,
                reference_base_url=reference.base_url,
                reference_model=MODEL,
                candidate_base_url=candidate.base_url,
                candidate_model=MODEL,
                max_tokens=args.max_tokens,
                top_logprobs=args.top_logprobs,
                concurrency=args.concurrency,
                case_count=args.cases,
            )
            started = time.perf_counter()
            done = execute_run(run.pk)
            walls.append(time.perf_counter() - started)
            assert done is not None and done.state == "completed", done and done.error
            assert done.done_count == args.cases and done.error_count == 0
            summary = done.summary
            print(f"rep: {walls[-1]:.2f} s", flush=True)
        figures = {
            "cases": args.cases,
            "reps": args.reps,
            "max_tokens": args.max_tokens,
            "concurrency": args.concurrency,
            "time_scale": args.time_scale,
            "wall_s": walls,
            "median_wall_s": statistics.median(walls),
            "per_case_ms": statistics.median(walls) / args.cases * 1000,
            "summary": summary,
        }
        print(json.dumps({k: v for k, v in figures.items() if k != "summary"}, indent=2))
        print(json.dumps(summary, indent=2))
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2))
    finally:
        reference.stop()
        candidate.stop()
        teardown_databases(old_config, verbosity=0)


if __name__ == "__main__":
    main()
