"""What a chain of in-process stages adds to a request, through the real HTTP path: the same request to
the same proxy process, from a tenant with a chain and from one without.

    .venv/bin/python benchmarks/stage_chain_overhead.py [--requests 300] [--reps 7]

One standalone proxy (`python -m routing.proxy`, as benchmarks/proxy_overhead.py starts it: a scratch
PostgreSQL database with the keys and the request log, Redis for the limits) in front of
`benchmarks/trivial_backend.py --echo`, which answers with the request's last message, here a small
JSON object, so the schema stage checks a real answer. Two tenants, both with the benchmark quota
(every counted limit set, far above the load: the limiter runs its whole script), each with a key:
`plain` has no chain; `chained` has a tenant chain with every in-process stage kind: a guard on the
prompt (mask), a classify stage (three rules, none matching, so every rule is evaluated), the generate
step, a guard on the answer (mask) and the schema check of the request's `response_format`
(`json_schema`), and a cache stage before classify. Every request is deterministic (temperature 0) with
a seed never sent before, so the cache looks up, misses and stores each answer (its whole cost; a hit
would skip the engine and say nothing about overhead). No term matches, so the answers are the same.

For each mode (JSON, stream) and rep, `--requests` sequential requests (one client, keep-alive) go to
each tenant in turn (the order alternates per rep), and each cell records its p50 latency and the
proxy's CPU time per request (/proc). Prints the medians over reps and the median of the per-rep
differences (chained minus plain, the two cells back to back).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from proxy_cpu import cpu_seconds
from proxy_overhead import BENCH_DIR, BENCH_QUOTA, REPO, bench_database, free_port, spawn, stop, wait_ready

from routing.proxy.stagespec import KINDS

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
}
ANSWER = '{"name": "Ada Lovelace", "age": 36}'
BODY: dict[str, Any] = {
    "model": "trivial",
    "messages": [{"role": "user", "content": ANSWER}],
    "max_tokens": 16,
    "temperature": 0,
    "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
}
JSON = {"Content-Type": "application/json"}
SEED = 0  # each request's seed, counted up (see `cell`)
TERMS = ["password", "secret key", "credit card", "ssn", "passport number", "date of birth"]
# The cache stage, before classify; every request misses it (see `cell`), so it costs a Redis lookup and
# a store per request.
CACHE_STAGE: dict[str, Any] | None = {"kind": "cache", "name": "cache"} if "cache" in KINDS else None
STAGES: list[dict[str, Any]] = [
    {"kind": "guard", "name": "prompt-terms", "config": {"terms": TERMS, "action": "mask"}},
    *([CACHE_STAGE] if CACHE_STAGE else []),
    {
        "kind": "classify",
        "name": "branch",
        "config": {
            "rules": [
                {"match": {"keywords": ["invoice", "refund", "chargeback"]}, "pool": "trivial"},
                {"match": {"images": True}, "pool": "trivial"},
                {"match": {"min_prompt_tokens": 100_000}, "pool": "trivial"},
            ]
        },
    },
    {"kind": "generate"},
    {"kind": "guard", "name": "answer-terms", "config": {"terms": TERMS, "action": "mask"}},
    {"kind": "schema", "name": "check"},
]


def setup(db_url: str) -> dict[str, str]:
    """Migrate, make the two tenants (both with the quota) and their keys, the chained tenant's chain."""
    env = {**os.environ, "DATABASE_URL": db_url, "DJANGO_SETTINGS_MODULE": "inferchain.settings"}
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=REPO, env=env, check=True
    )
    script = (
        "import json, django; django.setup()\n"
        "from console.models import Quota, Tenant\n"
        "from console.services import issue_api_key\n"
        "from routing.models import StageChain\n"
        "keys = {}\n"
        "for name in ('plain', 'chained'):\n"
        "    t, _ = Tenant.objects.get_or_create(name='bench-' + name)\n"
        "    Quota.objects.update_or_create(tenant=t, defaults=json.loads(QUOTA))\n"
        "    keys[name] = issue_api_key(tenant=t, name='bench').raw_key\n"
        "    if name == 'chained':\n"
        "        StageChain.objects.create(\n"
        "            name='bench', alias='trivial', tenant=t, stages=json.loads(STAGES)\n"
        "        )\n"
        "print(json.dumps(keys))\n"
    )
    script = script.replace("QUOTA", repr(json.dumps(BENCH_QUOTA))).replace(
        "STAGES", repr(json.dumps(STAGES))
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, check=True, capture_output=True)
    return dict(json.loads(out.stdout.decode().strip().splitlines()[-1]))


async def cell(
    session: aiohttp.ClientSession, url: str, key: str, stream: bool, count: int, pid: int
) -> tuple[float, float]:
    """`count` sequential requests: (p50 latency in ms, proxy CPU per request in us)."""
    global SEED
    headers = {"Authorization": f"Bearer {key}", **JSON}
    latencies = []
    cpu0 = cpu_seconds(pid)
    for _ in range(count):
        # Deterministic (temperature 0) and never the same twice (a fresh seed): the cache stage looks
        # up, misses and stores every answer, its whole cost, and no answer is replayed.
        SEED += 1
        body = json.dumps({**BODY, "stream": stream, "seed": SEED}).encode()
        t0 = time.perf_counter()
        async with session.post(url, data=body, headers=headers) as resp:
            payload = await resp.read()
        latencies.append(time.perf_counter() - t0)
        if resp.status != 200 or (stream and b"[DONE]" not in payload) or b'"error"' in payload:
            raise RuntimeError(f"unexpected answer {resp.status}: {payload[:300]!r}")
    cpu = cpu_seconds(pid) - cpu0
    return statistics.median(latencies) * 1000, cpu / count * 1e6


async def check_chain(session: aiohttp.ClientSession, url: str, keys: dict[str, str]) -> None:
    """The chained tenant's answers are checked (an answer that is not JSON is refused), the plain
    tenant's are not: the chain is loaded and applies to one tenant only."""
    bad = json.dumps({**BODY, "messages": [{"role": "user", "content": "not json"}]}).encode()
    deadline = time.monotonic() + 30
    while True:
        async with session.post(
            url, data=bad, headers={"Authorization": f"Bearer {keys['chained']}", **JSON}
        ) as resp:
            await resp.read()
            if resp.status == 502:
                break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the proxy did not load the chain (last answer: {resp.status})")
        await asyncio.sleep(0.5)
    async with session.post(
        url, data=bad, headers={"Authorization": f"Bearer {keys['plain']}", **JSON}
    ) as resp:
        await resp.read()
        assert resp.status == 200, resp.status


async def run(url: str, keys: dict[str, str], pid: int, requests: int, reps: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        await check_chain(session, url, keys)
        for stream in (False, True):
            for name in ("plain", "chained"):
                await cell(session, url, keys[name], stream, requests // 2, pid)  # warm-up
        for mode in ("json", "stream"):
            out[mode] = {"plain": [], "chained": []}
        for rep in range(reps):
            for mode in ("json", "stream"):
                order = ["plain", "chained"] if rep % 2 == 0 else ["chained", "plain"]
                for name in order:
                    p50, cpu = await cell(session, url, keys[name], mode == "stream", requests, pid)
                    out[mode][name].append({"p50_ms": p50, "cpu_us": cpu})
                    print(f"rep {rep} {mode:6s} {name:8s} p50 {p50:.3f} ms  CPU {cpu:.0f} us/req", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=300, help="sequential requests per cell")
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="chain-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    load0 = os.getloadavg()[0]
    with bench_database("postgres", "chain") as db_url:
        try:
            backend_port = free_port()
            procs.append(
                spawn(
                    [sys.executable, "benchmarks/trivial_backend.py", "--port", str(backend_port), "--echo"],
                    logs / "backend.log",
                )
            )
            wait_ready(f"http://127.0.0.1:{backend_port}/health", procs[-1])
            keys = setup(db_url)
            port = free_port()
            env = {
                **os.environ,
                "DATABASE_URL": db_url,
                "PROXY_STATIC_ENDPOINTS": f"trivial=http://127.0.0.1:{backend_port}",
                "REDIS_KEY_PREFIX": f"chainbench{os.getpid()}:",
                "REQUEST_LOG_SPOOL_DIR": str(logs / "spool"),
            }
            procs.append(
                spawn([sys.executable, "-m", "routing.proxy", "--port", str(port)], logs / "proxy.log", env)
            )
            wait_ready(f"http://127.0.0.1:{port}/healthz", procs[-1])
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            results = asyncio.run(run(url, keys, procs[-1].pid, args.requests, args.reps))
        finally:
            for proc in reversed(procs):
                stop(proc)
    ended = time.strftime("%H:%M:%S", time.gmtime())
    results["meta"] = {
        "started": started,
        "ended": ended,
        "load_average": [load0, os.getloadavg()[0]],
        "requests": args.requests,
        "reps": args.reps,
        "stages": STAGES,
    }
    (BENCH_DIR / "stage_chain_overhead.json").write_text(json.dumps(results, indent=2))
    print(
        f"\n{started}-{ended} UTC, load average {load0:.1f} -> {os.getloadavg()[0]:.1f}, "
        f"{args.reps} reps x {args.requests} sequential requests per cell"
    )
    print(
        "| mode | p50 no chain (ms) | p50 chain (ms) | added p50 (ms, median of reps) | "
        "CPU no chain (us/req) | CPU chain | added CPU (us/req) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for mode in ("json", "stream"):
        plain, chained = results[mode]["plain"], results[mode]["chained"]

        def med(rows: list[dict[str, float]], field: str) -> float:
            return statistics.median(r[field] for r in rows)

        added = statistics.median(c["p50_ms"] - p["p50_ms"] for p, c in zip(plain, chained, strict=True))
        added_cpu = statistics.median(c["cpu_us"] - p["cpu_us"] for p, c in zip(plain, chained, strict=True))
        print(
            f"| {mode} | {med(plain, 'p50_ms'):.3f} | {med(chained, 'p50_ms'):.3f} | {added:+.3f} | "
            f"{med(plain, 'cpu_us'):.0f} | {med(chained, 'cpu_us'):.0f} | {added_cpu:+.0f} |"
        )


if __name__ == "__main__":
    main()
