"""CPU time of one proxy process per request, JSON and streaming, at 16 clients, with and without a quota.

    .venv/bin/python benchmarks/proxy_cpu.py [--requests 6000] [--reps 3] [--keys quota,noquota]
        [--compare-tree ../before]

Same setup as benchmarks/proxy_overhead.py (trivial backend, standalone proxy, a scratch PostgreSQL
database or `--db sqlite`; `--servers inferchain,uvicorn` compares HTTP servers). Each proxy is sent
traffic under two keys, one of a tenant with a quota far above the load (every counted limit set:
the path real tenants take, one limiter call at admission and one at completion) and one of a tenant
without (no Redis call); their reps alternate on the same process, so the ratio is the quota's cost.
For each mode, `--requests` requests are sent by 16 concurrent loops after a warm-up; the proxy's
user + system CPU time is read from /proc/<pid>/stat before and after, and divided by the number of
requests. Throughput on a shared machine moves with other load; CPU per request moves much less, so
this is the figure to compare hot-path changes with. Prints the median of `--reps` per mode.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from proxy_overhead import (
    BENCH_DIR,
    BODY,
    REPO,
    bench_database,
    free_port,
    setup_inferchain_db,
    spawn,
    stop,
    wait_ready,
)

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of `pid` (its threads included) from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


async def send(url: str, key: str, stream: bool, count: int, clients: int = 16) -> None:
    body = json.dumps({**BODY, "stream": stream}).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    left = count
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), headers=headers) as session:

        async def loop() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                async with session.post(url, data=body) as resp:
                    payload = await resp.read()
                    if resp.status != 200 or (stream and b"[DONE]" not in payload):
                        raise RuntimeError(f"bad answer {resp.status}: {payload[:200]!r}")

        await asyncio.gather(*(loop() for _ in range(clients)))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--mode", choices=("both", "json", "stream"), default="both")
    parser.add_argument("--db", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument(
        "--servers",
        type=lambda v: v.split(","),
        default=["inferchain"],
        help="comma-separated HTTP servers for the proxy to compare: inferchain (default), uvicorn",
    )
    parser.add_argument(
        "--keys",
        type=lambda v: v.split(","),
        default=["quota", "noquota"],
        help="comma-separated tenants to send as: quota (limits far above the load), noquota",
    )
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument(
        "--compare-tree",
        type=Path,
        default=None,
        help="another checkout of this repository (e.g. `git worktree add ../before main`): for each server "
        "a second proxy runs from it (`<server>@before`, same database and keys), its reps interleaved "
        "with this tree's, and the ratio this tree / that tree is printed",
    )
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="proxy-cpu-"))
    procs = []
    databases = contextlib.ExitStack()
    try:
        backend_port = free_port()
        procs.append(
            spawn(
                [sys.executable, "benchmarks/trivial_backend.py", "--port", str(backend_port)],
                logs / "backend.log",
            )
        )
        wait_ready(f"http://127.0.0.1:{backend_port}/health", procs[-1])
        proxies: dict[str, tuple[subprocess.Popen[bytes], str, dict[str, str]]] = {}
        for server in args.servers:
            db_url = databases.enter_context(bench_database(args.db, f"cpu_{server}"))
            raw_keys = setup_inferchain_db(db_url)
            port = free_port()
            env = {
                **os.environ,
                "DATABASE_URL": db_url,
                "PROXY_STATIC_ENDPOINTS": f"trivial=http://127.0.0.1:{backend_port}",
                "REDIS_KEY_PREFIX": f"benchcpu{os.getpid()}{server}:",
                "REQUEST_LOG_SPOOL_DIR": str(logs / f"spool-{server}"),
            }
            proxy = spawn(
                [
                    *(sys.executable, "-m", "routing.proxy", "--port", str(port)),
                    *("--workers", "1", "--server", server),
                ],
                logs / f"proxy-{server}.log",
                env,
            )
            procs.append(proxy)
            wait_ready(f"http://127.0.0.1:{port}/healthz", proxy)
            proxies[server] = (proxy, f"http://127.0.0.1:{port}/v1/chat/completions", raw_keys)
            if args.compare_tree is not None:
                tree = args.compare_tree.resolve()
                port = free_port()
                before_env = {
                    **env,
                    "PYTHONPATH": str(tree),
                    "REDIS_KEY_PREFIX": f"benchcpu{os.getpid()}{server}before:",
                    "REQUEST_LOG_SPOOL_DIR": str(logs / f"spool-{server}-before"),
                    # The keys were hashed with this tree's secret (var/secret_key unless set).
                    "SECRET_KEY_FILE": os.environ.get("SECRET_KEY_FILE", str(REPO / "var" / "secret_key")),
                }
                proxy = spawn(
                    [
                        *(sys.executable, "-m", "routing.proxy", "--port", str(port)),
                        *("--workers", "1", "--server", server),
                    ],
                    logs / f"proxy-{server}-before.log",
                    before_env,
                    cwd=tree,
                )
                procs.append(proxy)
                wait_ready(f"http://127.0.0.1:{port}/healthz", proxy)
                proxies[f"{server}@before"] = (
                    proxy,
                    f"http://127.0.0.1:{port}/v1/chat/completions",
                    raw_keys,
                )
        modes = {"both": (False, True), "json": (False,), "stream": (True,)}[args.mode]
        cells = [(server, key) for server in proxies for key in args.keys]
        for stream in modes:
            per_request: dict[tuple[str, str], list[float]] = {cell: [] for cell in cells}
            for server, key in cells:
                _proxy, url, raw_keys = proxies[server]
                asyncio.run(send(url, raw_keys[key], stream, 1000, args.clients))  # warm-up
            for _ in range(args.reps):  # interleaved, so that a change in machine load hits every cell
                for server, key in cells:
                    proxy, url, raw_keys = proxies[server]
                    before = cpu_seconds(proxy.pid)
                    asyncio.run(send(url, raw_keys[key], stream, args.requests, args.clients))
                    per_request[server, key].append((cpu_seconds(proxy.pid) - before) / args.requests * 1e6)
            mode = "stream" if stream else "json"
            for (server, key), values in per_request.items():
                runs = ", ".join(f"{v:.0f}" for v in values)
                print(
                    f"{mode:6s} {server:10s} {key:8s} {statistics.median(values):4.0f} us CPU "
                    f"per request (runs: {runs}; load average {os.getloadavg()[0]:.2f})",
                    flush=True,
                )
            for server in args.servers:
                if f"{server}@before" not in proxies:
                    continue
                for key in args.keys:
                    this_runs, before_runs = per_request[server, key], per_request[f"{server}@before", key]
                    ratios = [a / b for a, b in zip(this_runs, before_runs, strict=True)]
                    print(
                        f"{mode:6s} {server:10s} {key:8s} this tree / compare tree CPU per request: "
                        f"{statistics.median(ratios):.3f} (reps: {', '.join(f'{r:.3f}' for r in ratios)})",
                        flush=True,
                    )
            for server in proxies:
                if "quota" in args.keys and "noquota" in args.keys:
                    # Ratio within each rep (the two ran back to back), then the median of those.
                    quota, noquota = per_request[server, "quota"], per_request[server, "noquota"]
                    ratios = [q / n for q, n in zip(quota, noquota, strict=True)]
                    print(
                        f"{mode:6s} {server:10s} quota / noquota CPU per request: "
                        f"{statistics.median(ratios):.2f} (reps: {', '.join(f'{r:.2f}' for r in ratios)})",
                        flush=True,
                    )
    finally:
        for proc in reversed(procs):
            stop(proc)
        databases.close()


if __name__ == "__main__":
    main()
