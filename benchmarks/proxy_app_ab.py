"""Before/after of the proxy's app code: `proxy_app_cpu.py` run alternately from this checkout and
another one, its blocks pooled per tree.

    .venv/bin/python benchmarks/proxy_app_ab.py --compare-tree ../before [--rounds 8] [--mode json]

Starts `benchmarks/trivial_backend.py`, then for each round runs `proxy_app_cpu.py` (this checkout's
copy of the script, so both trees are measured alike) once with PYTHONPATH and working directory this
checkout and once the other tree, in alternating order; each run prints the CPU per request of
`--blocks` blocks of `--requests` requests. Prints min, p10, p25 and median per tree and their
ratios. The low percentiles are the figures that hold on a shared machine: other processes' bursts
only ever add time to a block.

`--instructions` counts instead of timing (valgrind's callgrind, instrumentation on for the requests
only): each tree runs once with `--requests` and once with four times as many, and the difference over
the extra requests is its instructions per request. The count does not move with the machine's load
(repeat runs agree within 0.1%), so it resolves a few percent where CPU time on a shared machine
cannot; it weighs every instruction alike (a cache miss costs no more than an add).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from vllm_sim.testing import free_port  # noqa: E402


def run(tree: Path, port: int, requests: int, blocks: int, mode: str) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, str(HERE / "proxy_app_cpu.py"), str(port), str(requests), str(blocks), mode],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return [float(v) for v in out.stdout.split()]


def instructions(tree: Path, port: int, requests: int, mode: str) -> int:
    env = {**os.environ, "PYTHONPATH": str(tree), "PROXY_APP_CPU_CALLGRIND": "1"}
    out = subprocess.run(
        [
            *("valgrind", "--tool=callgrind", "--instr-atstart=no", "--callgrind-out-file=/dev/null"),
            *(sys.executable, str(HERE / "proxy_app_cpu.py"), str(port), str(requests), "1", mode),
        ],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=True,
    )
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise RuntimeError(f"no callgrind total in: {out.stderr[-2000:]}")
    return int(found.group(1))


def count_instructions(args: argparse.Namespace, port: int, before: Path) -> None:
    per: dict[str, float] = {}
    for name, tree in (("after", REPO), ("before", before)):
        small = instructions(tree, port, args.requests, args.mode)
        large = instructions(tree, port, 4 * args.requests, args.mode)
        per[name] = (large - small) / (3 * args.requests)
        print(f"{name}: {per[name]:.0f} instructions per request", flush=True)
    print(f"after / before: {per['after'] / per['before']:.3f} ({args.mode})")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--compare-tree", required=True, type=Path, help="the other checkout (before)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--mode", choices=("json", "stream"), default="json")
    parser.add_argument("--instructions", action="store_true", help="count instructions (valgrind)")
    args = parser.parse_args()
    before = args.compare_tree.resolve()
    port = free_port()
    backend = subprocess.Popen(
        [sys.executable, str(HERE / "trivial_backend.py"), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(1.0)
        if args.instructions:
            count_instructions(args, port, before)
            return
        cells: dict[str, list[float]] = {"after": [], "before": []}
        started = time.strftime("%H:%M:%S", time.gmtime())
        load0 = os.getloadavg()[0]
        for n in range(args.rounds):
            order = [("after", REPO), ("before", before)]
            if n % 2:
                order.reverse()
            for name, tree in order:
                got = run(tree, port, args.requests, args.blocks, args.mode)
                cells[name].extend(got)
                print(f"round {n} {name}: {' '.join(f'{v:.1f}' for v in got)}", flush=True)
        ended = time.strftime("%H:%M:%S", time.gmtime())
        print(
            f"\n{args.mode}, {args.rounds} rounds x {args.blocks} blocks x {args.requests} requests, "
            f"{started}-{ended} UTC, load average {load0:.1f} -> {os.getloadavg()[0]:.1f}"
        )
        print("| tree | min | p10 | p25 | median | n |")
        print("|---|---:|---:|---:|---:|---:|")
        stats = {}
        for name, values in cells.items():
            stats[name] = (
                min(values),
                pct(values, 0.1),
                pct(values, 0.25),
                statistics.median(values),
            )
            print(f"| {name} | " + " | ".join(f"{v:.1f}" for v in stats[name]) + f" | {len(values)} |")
        ratio = [a / b for a, b in zip(stats["after"], stats["before"], strict=True)]
        print("| after / before | " + " | ".join(f"{r:.3f}" for r in ratio) + " | |")
    finally:
        backend.terminate()
        backend.wait(5)


if __name__ == "__main__":
    main()
