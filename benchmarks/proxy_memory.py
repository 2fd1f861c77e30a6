"""Proxy memory stays flat: RSS after warm-up vs after 100,000 requests.

    .venv/bin/python benchmarks/proxy_memory.py [--requests 100000] [--clients 32] [--key quota|noquota]

Runs the standalone proxy (one worker) in front of the trivial backend, with its request log in a
scratch PostgreSQL database (`--db sqlite` for the demo's SQLite),
sends `--requests` requests (every fourth one streaming) as a tenant with a quota far above the load
(the limiter's path, as real tenants take it; `--key noquota` for a tenant without), and samples
the proxy's RSS from /proc/<pid>/status every 10,000 requests. Growth is measured from the sample
after the first 10,000 (warm-up: connection pools, caches, metric children) to the last. Target:
under 5 %.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_overhead import (
    BENCH_DIR,
    BODY,
    bench_database,
    free_port,
    setup_inferchain_db,
    spawn,
    stop,
    wait_ready,
)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def drive(url: str, key: str, total: int, clients: int, pid: int) -> list[tuple[int, int]]:
    samples: list[tuple[int, int]] = []
    sent = 0
    done = 0
    bodies = [json.dumps({**BODY, "stream": i % 4 == 3}).encode() for i in range(4)]
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), headers=headers) as session:

        async def worker() -> None:
            nonlocal sent, done
            while sent < total:
                i = sent
                sent += 1
                async with session.post(url, data=bodies[i % 4]) as resp:
                    await resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"status {resp.status}")
                done += 1
                if done % 10_000 == 0:
                    samples.append((done, rss_kib(pid)))

        await asyncio.gather(*(worker() for _ in range(clients)))
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--db", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--key", choices=("quota", "noquota"), default="quota")
    args = parser.parse_args()
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="proxy-mem-"))
    procs: list[subprocess.Popen[bytes]] = []
    databases = contextlib.ExitStack()
    try:
        backend_port = free_port()
        procs.append(
            spawn(
                [sys.executable, "benchmarks/trivial_backend.py", "--port", str(backend_port)], logs / "b.log"
            )
        )
        wait_ready(f"http://127.0.0.1:{backend_port}/health", procs[-1])
        db_url = databases.enter_context(bench_database(args.db, "memory"))
        key = setup_inferchain_db(db_url)[args.key]
        port = free_port()
        env = {
            **os.environ,
            "DATABASE_URL": db_url,
            "PROXY_STATIC_ENDPOINTS": f"trivial=http://127.0.0.1:{backend_port}",
            "REDIS_KEY_PREFIX": f"benchmem{os.getpid()}:",
            "REQUEST_LOG_SPOOL_DIR": str(logs / "spool"),
        }
        procs.append(spawn([sys.executable, "-m", "routing.proxy", "--port", str(port)], logs / "p.log", env))
        wait_ready(f"http://127.0.0.1:{port}/healthz", procs[-1])
        started = time.perf_counter()
        samples = asyncio.run(
            drive(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                key,
                args.requests,
                args.clients,
                procs[-1].pid,
            )
        )
        elapsed = time.perf_counter() - started
    finally:
        for proc in reversed(procs):
            stop(proc)
        databases.close()
    for n, kib in samples:
        print(f"after {n:>7,d} requests: RSS {kib / 1024:7.1f} MiB")
    base, last = samples[0][1], samples[-1][1]
    growth = (last - base) / base * 100
    print(
        f"\n{args.requests:,d} requests as {args.key} in {elapsed:.0f} s; "
        f"RSS growth after warm-up: {growth:+.2f} %"
    )
    (BENCH_DIR / "proxy_memory.json").write_text(
        json.dumps({"key": args.key, "samples": samples, "growth_percent": growth, "seconds": elapsed})
    )


if __name__ == "__main__":
    main()
