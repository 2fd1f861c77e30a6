"""`inferchain bench`: the command line of the load-test tool (docs/bench.md)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.client import BenchError
from bench.runner import Level, Plan, Report, run
from bench.stats import Slo
from bench.workload import SyntheticMix, WorkloadError, load_jsonl, synthetic

EXIT_BAD_INPUT, EXIT_STOPPED, EXIT_INTERRUPTED = 2, 3, 130


def _numbers(text: str, kind: type[int] | type[float], what: str) -> list[Any]:
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{what} must be a comma-separated list of numbers, got {text!r}"
        ) from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{what} must be positive numbers, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inferchain", description="inferchain command-line tools")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "bench",
        help="load-test an OpenAI-compatible endpoint",
        description="Load-test an OpenAI-compatible endpoint: a sweep of load levels, stopped past the knee",
    )
    p.add_argument("--target", required=True, help="base URL, e.g. http://127.0.0.1:8000 (without /v1)")
    p.add_argument(
        "--key-env",
        default="INFERCHAIN_API_KEY",
        help="environment variable holding the API key (default INFERCHAIN_API_KEY, then OPENAI_API_KEY); "
        "never pass a key on the command line",
    )
    p.add_argument("--key-file", type=Path, help="file holding the API key (instead of --key-env)")
    p.add_argument("--model", help="model to request (default: the first the target lists)")
    src = p.add_argument_group("workload (a JSON-lines file, or a synthetic mix)")
    src.add_argument(
        "--workload", type=Path, help="JSON lines: messages or prompt, max_tokens, prefix_group, session_id"
    )
    src.add_argument("--prompt-tokens", type=int, default=256, help="synthetic: mean prompt length (words)")
    src.add_argument("--output-tokens", type=int, default=128, help="synthetic: mean max_tokens")
    src.add_argument("--long-share", type=float, default=0.0, help="synthetic: share of long prompts, 0-1")
    src.add_argument(
        "--long-prompt-tokens", type=int, default=7000, help="synthetic: mean long prompt length"
    )
    src.add_argument(
        "--shared-prefixes", type=int, default=0, help="synthetic: number of shared system prompts"
    )
    src.add_argument(
        "--prefix-tokens", type=int, default=1000, help="synthetic: length of each shared prompt"
    )
    src.add_argument(
        "--completions", action="store_true", help="synthetic: /v1/completions prompts, not chat"
    )
    load = p.add_argument_group("load")
    mode = load.add_mutually_exclusive_group()
    mode.add_argument("--clients", default="1,10,20,50", help="closed loop: comma-separated client counts")
    mode.add_argument("--rates", help="open loop (Poisson arrivals): comma-separated requests/s")
    load.add_argument("--requests", type=int, default=100, help="requests per level (default 100)")
    load.add_argument(
        "--max-seconds", type=float, default=120.0, help="wall-time cap per level (default 120)"
    )
    load.add_argument("--timeout", type=float, default=120.0, help="per-request timeout in seconds")
    load.add_argument("--no-stop-at-knee", action="store_true", help="run every level even past the knee")
    load.add_argument(
        "--knee-rise", type=float, default=2.0, help="latency p50 over its floor that marks the knee"
    )
    load.add_argument(
        "--extra-body", help="JSON merged into every request body, e.g. '{\"ignore_eos\": true}'"
    )
    load.add_argument("--seed", type=int, default=0)
    slo = p.add_argument_group("goodput SLO")
    slo.add_argument("--slo-ttft-ms", type=float, default=500.0, help="TTFT bound of a good request (ms)")
    slo.add_argument("--slo-itl-ms", type=float, default=50.0, help="TPOT bound of a good request (ms)")
    out = p.add_argument_group("output")
    out.add_argument("--out", type=Path, help="results JSON (default bench-<time>.json); plots beside it")
    out.add_argument("--no-plot", action="store_true")
    out.add_argument("--no-progress", action="store_true")
    return parser


def read_key(args: argparse.Namespace) -> str | None:
    if args.key_file is not None:
        try:
            return args.key_file.read_text().strip() or None
        except OSError as exc:
            raise WorkloadError(f"{args.key_file}: cannot read the key file ({exc.strerror})") from None
    return os.environ.get(args.key_env) or os.environ.get("OPENAI_API_KEY") or None


def make_plan(args: argparse.Namespace) -> Plan:
    if args.workload is not None:
        items = load_jsonl(args.workload)
    else:
        mix = SyntheticMix(
            requests=max(args.requests, 1),
            prompt_tokens=args.prompt_tokens,
            output_tokens=args.output_tokens,
            long_share=args.long_share,
            long_prompt_tokens=args.long_prompt_tokens,
            shared_prefixes=args.shared_prefixes,
            prefix_tokens=args.prefix_tokens,
            seed=args.seed,
            chat=not args.completions,
        )
        items = synthetic(mix)
    if args.rates:
        levels = [Level(rate=r) for r in _numbers(args.rates, float, "--rates")]
    else:
        levels = [Level(clients=c) for c in _numbers(args.clients, int, "--clients")]
    extra = None
    if args.extra_body:
        try:
            extra = json.loads(args.extra_body)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"--extra-body is not valid JSON ({exc.msg})") from None
        if not isinstance(extra, dict):
            raise WorkloadError("--extra-body must be a JSON object")
    if args.requests < 1:
        raise WorkloadError("--requests must be at least 1")
    return Plan(
        target=args.target.rstrip("/"),
        key=read_key(args),
        model=args.model,
        items=items,
        levels=levels,
        requests_per_level=args.requests,
        max_seconds_per_level=args.max_seconds,
        timeout_s=args.timeout,
        slo=Slo(ttft_s=args.slo_ttft_ms / 1000, itl_s=args.slo_itl_ms / 1000),
        stop_past_knee=not args.no_stop_at_knee,
        knee_rise=args.knee_rise,
        seed=args.seed,
        extra_body=extra,
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def table(result: dict[str, Any]) -> str:
    head = (
        f"{'load':>12} {'ok/sent':>9} {'req/s':>7} {'tok/s':>8} {'goodput':>8} "
        f"{'TTFT p50/p99 ms':>16} {'ITL p50/p99 ms':>15} {'e2e p50/p99 ms':>16}  errors"
    )
    lines = [head]
    for i, lv in enumerate(result["levels"]):
        load = f"{lv['clients']} cl" if lv["clients"] is not None else f"{lv['rate']:g}/s"
        mark = " <- knee" if i == result["knee_index"] else (" (partial)" if lv.get("partial") else "")
        ttft, itl, e2e = (
            _ms(lv[m]["p50"]) + "/" + _ms(lv[m]["p99"]) for m in ("ttft_s", "itl_s", "latency_s")
        )
        errors = ", ".join(f"{k}: {v}" for k, v in lv["errors"].items()) or "-"
        lines.append(
            f"{load:>12} {lv['ok']:>4}/{lv['requests']:<4} {lv['requests_per_s']:>7.2f} "
            f"{lv['output_tokens_per_s']:>8.1f} {lv['goodput_requests_per_s']:>8.2f} "
            f"{ttft:>16} {itl:>15} {e2e:>16}  {errors}{mark}"
        )
    return "\n".join(lines)


def _progress(enabled: bool) -> Any:
    from tqdm import tqdm

    def make(total: int, label: str) -> Any:
        return tqdm(total=total, desc=label, unit="req", disable=not enabled, file=sys.stderr, leave=False)

    return make


def bench(args: argparse.Namespace) -> int:
    try:
        plan = make_plan(args)
    except WorkloadError as exc:
        print(f"inferchain bench: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    report = Report(plan=plan)
    code = 0
    try:
        asyncio.run(run(plan, report, _progress(not args.no_progress)))
    except BenchError as exc:
        report.close_current()
        report.stopped = str(exc)
        print(f"inferchain bench: stopped: {exc}", file=sys.stderr)
        code = EXIT_STOPPED
    except KeyboardInterrupt:
        report.interrupted = True
        report.close_current()
        print("inferchain bench: interrupted; writing what was measured so far", file=sys.stderr)
        code = EXIT_INTERRUPTED
    result = report.as_dict()
    if not result["levels"] and code == EXIT_STOPPED:
        return code
    out = args.out or Path(f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json")
    out.write_text(json.dumps(result, indent=2))
    print(table(result))
    written = [out]
    if not args.no_plot and result["levels"]:
        from bench.plot import plot

        written += plot(result, out)
    print("wrote " + ", ".join(str(p) for p in written))
    return code


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "bench":
        return bench(args)
    return EXIT_BAD_INPUT  # pragma: no cover - argparse requires a command


if __name__ == "__main__":
    sys.exit(main())
