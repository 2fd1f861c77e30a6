"""One simulator process pinned to one core serves 200 concurrent streams at its profile's token rates.

Wall-clock rates on a shared machine are noisy, so the test asserts what one core must deliver: every
stream completes with the right token count, and the simulator's own CPU time stays well under the
wall time of the run (it does not need more than the one core it has). benchmarks/sim_load.py
measures the rates themselves.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import pytest

from tests.sim.conftest import MODEL
from vllm_sim.loadgen import run_streams
from vllm_sim.testing import start_sim

pytestmark = pytest.mark.slow


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(
    shutil.which("taskset") is None or len(os.sched_getaffinity(0)) < 2, reason="needs taskset, 2 cores"
)
def test_two_hundred_streams_on_one_core() -> None:
    sim = start_sim(MODEL, "--max-model-len", "4096", cpu=0)
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, mask - {0})  # keep this client off the simulator's core
    try:
        cpu_before = cpu_seconds(sim.proc.pid)

        t0 = time.perf_counter()
        results = asyncio.run(
            run_streams(sim.base_url, MODEL, concurrency=200, prompt_words=128, max_tokens=128)
        )
        wall = time.perf_counter() - t0
        cpu = cpu_seconds(sim.proc.pid) - cpu_before
    finally:
        os.sched_setaffinity(0, mask)
        sim.stop()
    assert [r.status for r in results] == [200] * 200
    assert all(r.completion_tokens == 128 for r in results)
    assert all(r.ttft > 0 for r in results)
    # 25,600 tokens streamed to 200 clients using well under one core.
    assert cpu < 0.7 * wall
