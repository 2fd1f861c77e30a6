"""Before/after of the proxy's app code: `proxy_app_cpu.py` run alternately from this checkout and
another one, its blocks pooled per tree.

    .venv/bin/python benchmarks/proxy_app_ab.py --compare-tree ../before [--rounds 8] [--mode json]

Starts `benchmarks/trivial_backend.py`, then for each round runs `proxy_app_cpu.py` (this checkout's
copy of the script, so both trees are measured alike) once with PYTHONPATH and working directory this
checkout and once the other tree, in alternating order; each run prints the CPU per request of
`--blocks` blocks of `--requests` requests. Prints min, p10, p25 and median per tree and their
ratios. The low percentiles are the figures that hold on a shared machine: other processes' bursts
only ever add time to a block.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from nodes.sim.testing import free_port  # noqa: E402


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
