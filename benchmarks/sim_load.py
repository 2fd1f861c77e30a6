"""Benchmark of the vLLM simulator (one command): `.venv/bin/python benchmarks/sim_load.py`.

1. TTFT and ITL of each profile at 1 and at 32 concurrent streams (512-token prompts, 128 output
   tokens, real time, median of the per-request values over `--rounds` rounds).
2. 200 concurrent streams against one simulator process pinned to one core (`taskset -c 0`), at the
   H100 profile's real token rates: does one core keep up? Reports the aggregate output rate, the
   simulator's CPU use, and how far its engine fell behind its modelled clock (lost_wall_s).

The simulator runs on core 0 and this client on core 1, so the client's own work does not steal the
simulator's core. Results go to stdout as Markdown (paste into docs/benchmarks.md) and as JSON to
--json-out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vllm_sim.loadgen import StreamResult, run_streams
from vllm_sim.profiles import PROFILES
from vllm_sim.testing import SimHandle, start_sim

MODEL = "bench-model"


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (and its threads) from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def runqueue_wait_seconds(pid: int) -> float:
    """Seconds the process's threads spent runnable but waiting for a CPU (/proc/<pid>/task/*/schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        total += int((task / "schedstat").read_text().split()[1])
    return total / 1e9


def sim_pid(handle: SimHandle) -> int:
    """The python process under taskset (taskset execs, so it is the same pid)."""
    return handle.proc.pid


def stats(handle: SimHandle) -> dict[str, Any]:
    with urllib.request.urlopen(handle.base_url + "/sim/stats", timeout=5) as r:
        return dict(json.load(r))


def latency_round(
    handle: SimHandle, concurrency: int, prompt_words: int, max_tokens: int, salt: int
) -> list[StreamResult]:
    return asyncio.run(
        run_streams(
            handle.base_url,
            MODEL,
            concurrency=concurrency,
            prompt_words=prompt_words,
            max_tokens=max_tokens,
            salt_base=salt,
        )
    )


def profile_latencies(profile: str, rounds: int) -> dict[str, Any]:
    tp = PROFILES[profile].recommended_tp
    handle = start_sim(
        MODEL, "--max-model-len", "8192", "--tensor-parallel-size", str(tp), profile=profile, cpu=0
    )
    out: dict[str, Any] = {"profile": profile}
    try:
        for conc in (1, 32):
            results: list[StreamResult] = []
            for r in range(rounds):
                # Fresh prompts every round: a repeated prompt would hit the prefix cache.
                results += latency_round(handle, conc, 512, 128, salt=r * 1000 + conc * 100)
            ok = [x for x in results if x.status == 200 and x.completion_tokens == 128]
            assert len(ok) == len(results), f"{profile} c={conc}: {len(results) - len(ok)} failed"
            out[f"c{conc}"] = {
                "ttft_ms": 1000 * statistics.median(x.ttft for x in ok),
                "itl_ms": 1000 * statistics.median(x.itl for x in ok),
                "requests": len(ok),
            }
        out["lost_wall_s"] = stats(handle)["lost_wall_s"]
    finally:
        handle.stop()
    return out


def load_200(streams: int, prompt_words: int, max_tokens: int) -> dict[str, Any]:
    handle = start_sim(MODEL, "--max-model-len", "8192", profile="h100-llama3-8b-fp16", cpu=0)
    try:
        before = stats(handle)
        cpu0 = cpu_seconds(sim_pid(handle))
        wait0 = runqueue_wait_seconds(sim_pid(handle))
        t0 = time.perf_counter()
        results = asyncio.run(
            run_streams(
                handle.base_url, MODEL, concurrency=streams, prompt_words=prompt_words, max_tokens=max_tokens
            )
        )
        wall = time.perf_counter() - t0
        cpu = cpu_seconds(sim_pid(handle)) - cpu0
        waited = runqueue_wait_seconds(sim_pid(handle)) - wait0
        after = stats(handle)
    finally:
        handle.stop()
    ok = [r for r in results if r.status == 200 and r.completion_tokens == max_tokens]
    model_busy = after["busy_model_s"] - before["busy_model_s"]
    return {
        "streams": streams,
        "completed": len(ok),
        "wall_s": wall,
        "modelled_busy_s": model_busy,
        "wall_over_model": wall / model_busy if model_busy else float("nan"),
        "output_tokens_per_s": sum(r.completion_tokens for r in ok) / wall,
        "ttft_median_ms": 1000 * statistics.median(r.ttft for r in ok),
        "itl_median_ms": 1000 * statistics.median(r.itl for r in ok),
        "sim_cpu_s": cpu,
        "sim_cpu_share_of_one_core": cpu / wall,
        # Time the simulator was ready to run but its core was busy with other processes.
        "sim_runqueue_wait_s": waited,
        "lost_wall_s": after["lost_wall_s"] - before["lost_wall_s"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--json-out", default="var/benchmarks/sim_load.json")
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) > 1:
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    latencies = [profile_latencies(p, args.rounds) for p in PROFILES]
    load = load_200(args.streams, 256, 256)
    print("| profile | TTFT 1 stream (ms) | ITL 1 stream (ms) | TTFT 32 streams (ms) | ITL 32 streams (ms) |")
    print("|---|---:|---:|---:|---:|")
    for row in latencies:
        c1, c32 = row["c1"], row["c32"]
        print(
            f"| {row['profile']} | {c1['ttft_ms']:.1f} | {c1['itl_ms']:.2f} "
            f"| {c32['ttft_ms']:.1f} | {c32['itl_ms']:.2f} |"
        )
    print()
    print(
        f"200-stream load ({load['streams']} streams x 256 prompt / 256 output tokens, "
        "h100-llama3-8b-fp16, sim on one core):"
    )
    for k, v in load.items():
        print(f"- {k}: {v:.3f}" if isinstance(v, float) else f"- {k}: {v}")
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"latencies": latencies, "load": load}, indent=2))
    return 0 if load["completed"] == load["streams"] else 1


if __name__ == "__main__":
    sys.exit(main())
