"""Fleet scale: virtual agents report a large fleet to the real control plane through the agent channel.

    .venv/bin/python benchmarks/fleet_scale.py [--agents 200] [--engines 1000] [--proxies 4] [--seconds 30]
                                               [--steps 50,100,200] [--web-workers 1]
                                               [--telemetry-seconds 1]

What runs, each as it runs in `make run`: the control plane's web process (uvicorn, one worker as in
the Procfile, or `--web-workers N`) on a fresh PostgreSQL database of its own, a private redis-server,
and `--proxies` proxy processes (`python -m routing.proxy`) that poll the engines' live state. The
agents are virtual: one asyncio process here plays `--agents` hosts, each with its own agent token,
syncing every NODE_TELEMETRY_SECONDS exactly as `python -m nodes.agent` does (`POST /api/agent/sync/` with the
heartbeat info, one sample per GPU and one live record per engine), with a state change now and then
(an engine degraded, then ready again: `--change-rate`, 1 % of syncs by default; 0 measures routine
syncs alone). `--steps` runs the same fleet with the first N agents only,
then more, so the table shows what grows with the fleet.

Measured per step, over `--seconds` after a warm-up: syncs answered per second against the rate the
agents ask for, sync latency (p50/p99) as the agents see it, the web process's CPU (cores), the
proxies' CPU, PostgreSQL writes per second (rows inserted, updated and deleted, and commits, from
pg_stat_database for this database alone), Redis commands per second (INFO commandstats of the private
server), the age of the live records in Redis (now minus the agent's sample time: what a proxy reads,
which adds at most its 0.25 s poll), and the console's fleet pages timed during the load, as a signed-in
admin: the Nodes page (a page of 12 hosts and one of 50 deployments, its two calls in parallel;
`fleet_page_*` in the JSON) and the dashboard (the fleet summary and a small page of each; `dashboard_*`).
With `--metrics-reps N`, the fleet exposition too: the web process gets a METRICS_TOKEN, and `/metrics`
is scraped as Prometheus scrapes it (`Authorization: Bearer <token>`, `Accept-Encoding: gzip`), with a
process rendering it ahead as the Celery worker's beat task does (`metrics_renderer` CPU), once at
the start of the warm-up (Prometheus scrapes all the time; not counted) and N times evenly over the
measured window, each timed to its last byte (`metrics_p50_ms`, `metrics_p95_ms`, `metrics_max_ms`;
`metrics_failures` counts answers other than a 200 gzip body).

Results in docs/benchmarks.md ("Fleet scale") and docs/capacity.md. The load generator shares the
machine's cores with what it measures: its own CPU is printed too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
PYTHON = sys.executable
RENDERER = (
    "import time, django; django.setup(); from routing.fleet_metrics import refresh_if_due\n"
    "while True:\n    refresh_if_due(); time.sleep(1.0)\n"
)
ADMIN_PASSWORD = secrets.token_urlsafe(12)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its reaped children, in seconds (from /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:  # gone: a PostgreSQL backend's time is then in its parent's reaped-children fields
        return 0.0
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))
    return ticks / os.sysconf("SC_CLK_TCK")


def wait_http(url: str, timeout: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{url}: the process exited:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except Exception:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not answer in {timeout} s:\n{log.read_text(errors='replace')[-3000:]}")


@dataclass
class Stack:
    tmp: Path
    env: dict[str, str]
    database: str
    admin_url: str
    redis_port: int
    procs: list[tuple[str, subprocess.Popen[bytes], Path]] = field(default_factory=list)

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = self.tmp / f"{name}.log"
        proc = subprocess.Popen(argv, cwd=REPO, env=self.env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
        self.procs.append((name, proc, log))
        return proc

    def stop(self) -> None:
        for _, proc, _ in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc, _ in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
        shutil.rmtree(self.tmp, ignore_errors=True)


def bring_up(args: argparse.Namespace) -> Stack:
    import psycopg

    tmp = Path(tempfile.mkdtemp(prefix="fleet-scale-"))
    database = f"bench_fleet_{os.getpid()}"
    admin_url = args.postgres.rstrip("/") + "/postgres"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    redis_port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "inferchain.settings",
        "DATABASE_URL": args.postgres.rstrip("/") + "/" + database,
        "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "SECRET_KEY": secrets.token_urlsafe(40),
        "PYTHONUNBUFFERED": "1",
    }
    stack = Stack(tmp=tmp, env=env, database=database, admin_url=admin_url, redis_port=redis_port)
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        raise SystemExit("redis-server is not installed (make services installs it)")
    stack.start(
        "redis",
        [redis_server, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
    )
    os.environ.update(
        {k: env[k] for k in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "REDIS_URL", "SECRET_KEY")}
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return stack


def build_fleet(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Hosts with GPUs, ready engines spread over them, one agent token per host, an admin to sign in."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fakefleet import create_fleet

    from console.models import User
    from nodes.agent_tokens import issue_agent_token
    from nodes.models import Deployment

    fleet = create_fleet("fleet", hosts=args.agents, gpus=args.gpus, engines=args.engines)
    User.objects.create_superuser("bench-admin", "", ADMIN_PASSWORD)
    by_host: dict[int, list[Any]] = {}
    for dep in Deployment.objects.filter(pk__in=[d.pk for d in fleet.deployments]).order_by("pk"):
        by_host.setdefault(dep.host_id, []).append(dep)
    agents = []
    for host in fleet.hosts:
        agents.append(
            {
                "host": host.name,
                # Kept in this process's memory for the run only; never printed or written.
                "token": issue_agent_token(host).raw_token,
                "deployments": [
                    {"id": d.pk, "name": d.served_model_name, "start_token": d.start_token}
                    for d in by_host.get(host.pk, [])
                ],
            }
        )
    return agents


def live_record(dep: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """An engine's live record, the fields `nodes.agent.remote.Agent.live_record` sends."""
    running = rng.randint(0, 12)
    return {
        "ts": time.time(),
        "deployment_id": dep["id"],
        "served_model_name": dep["name"],
        "engine": "vllm",
        "alive": True,
        "ready": True,
        "num_requests_running": running,
        "num_requests_waiting": rng.randint(0, 3),
        "kv_cache_usage_perc": round(rng.random(), 3),
        "num_gpu_blocks": 20000,
        "block_size": 16,
        "kv_cache_total_tokens": 320000,
        "prompt_tokens_total": rng.randint(10**6, 10**7),
        "generation_tokens_total": rng.randint(10**6, 10**7),
        "prefix_cache_queries_total": 1000,
        "prefix_cache_hits_total": 400,
        "tokens_per_s": round(rng.uniform(0, 3000), 2),
        "ttft_p50_s": 0.12,
        "itl_p50_s": 0.02,
        "ttft_p95_s": 0.4,
        "itl_p95_s": 0.05,
        "has_metrics": True,
    }


def gpu_samples(gpus: int, rng: random.Random) -> list[dict[str, Any]]:
    now = time.time()
    return [
        {
            "index": i,
            "ts": now,
            "simulated": False,
            "utilization_pct": float(rng.randint(0, 100)),
            "memory_used_bytes": rng.randint(0, 80 * 2**30),
            "memory_total_bytes": 80 * 2**30,
            "temperature_c": float(rng.randint(30, 80)),
            "power_watts": float(rng.randint(80, 700)),
        }
        for i in range(gpus)
    ]


@dataclass
class AgentStats:
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    changes_sent: int = 0
    changes_acked: int = 0
    routine: int = 0


async def virtual_agent(
    agent: dict[str, Any],
    base: str,
    period: float,
    gpus: int,
    stop: asyncio.Event,
    measuring: asyncio.Event,
    stats: AgentStats,
    session: Any,
    seed: int,
    change_rate: float,
) -> None:
    rng = random.Random(seed)
    info = {"version": "bench", "simulated_gpus": True, "gpu_note": "fleet_scale.py"}
    inventory: list[dict[str, Any]] | None = [
        {
            "index": i,
            "uuid": f"GPU-bench-{agent['host']}-{i}",
            "name": "NVIDIA H100 80GB HBM3",
            "memory_total_bytes": 80 * 2**30,
            "simulated": False,
        }
        for i in range(gpus)
    ]
    outbox: list[dict[str, Any]] = []
    generation: int | None = None  # of the last full answer, echoed as nodes.agent does
    headers = {"Authorization": f"Bearer {agent['token']}", "Content-Type": "application/json"}
    await asyncio.sleep(rng.uniform(0, period))  # agents start at different moments, as real ones do
    while not stop.is_set():
        started = time.monotonic()
        # Now and then an engine degrades (its queue stalls) and recovers: a state change each way.
        if agent["deployments"] and rng.random() < change_rate:
            dep = rng.choice(agent["deployments"])
            for kind in ("degraded", "ready"):
                outbox.append(
                    {
                        "id": secrets.token_hex(8),
                        "kind": kind,
                        "deployment_id": dep["id"],
                        "start_token": dep["start_token"],
                        "message": "fleet_scale.py",
                    }
                )
        batch = {
            "host": agent["host"],
            "info": info,
            "gpu_inventory": inventory,
            "gpus": gpu_samples(gpus, rng),
            "engines": [live_record(d, rng) for d in agent["deployments"]],
            "changes": list(outbox),
            "generation": generation,
        }
        try:
            async with session.post(
                base + "/api/agent/sync/", data=json.dumps(batch), headers=headers
            ) as resp:
                body = await resp.read()
                if resp.status == 200:
                    answer = json.loads(body)
                    inventory = None
                    if not answer.get("unchanged"):
                        generation = answer.get("generation")
                    elif measuring.is_set():
                        stats.routine += 1
                    acked = set(answer.get("acked", []))
                    if measuring.is_set():
                        stats.changes_sent += len(outbox)
                        stats.changes_acked += len(acked)
                    outbox = [c for c in outbox if c["id"] not in acked]
                elif measuring.is_set():
                    stats.errors[f"HTTP {resp.status}"] = stats.errors.get(f"HTTP {resp.status}", 0) + 1
        except Exception as exc:
            if measuring.is_set():
                stats.errors[type(exc).__name__] = stats.errors.get(type(exc).__name__, 0) + 1
        elapsed = time.monotonic() - started
        if measuring.is_set():
            stats.latencies.append(elapsed)
        await asyncio.sleep(max(0.0, period - elapsed))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def redis_commands(port: int) -> int:
    import redis

    stats = redis.Redis(port=port).info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def pg_writes(stack: Stack) -> tuple[int, int]:
    import psycopg

    with psycopg.connect(stack.admin_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT tup_inserted + tup_updated + tup_deleted, xact_commit FROM pg_stat_database "
            "WHERE datname = %s",
            [stack.database],
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def live_ages(port: int, agents: list[dict[str, Any]]) -> list[float]:
    """Now minus the agent's sample time, for every engine's live record in Redis."""
    import redis

    from nodes.lifecycle import live_deployment_key

    keys = [live_deployment_key(d["id"]) for a in agents for d in a["deployments"]]
    now = time.time()
    ages = []
    for raw in redis.Redis(port=port).mget(keys):
        if raw:
            ages.append(now - float(json.loads(raw)["ts"]))
    return ages


# What each console page asks for on load (frontend/src/pages/nodes/NodesPage.tsx, .../DashboardPage.tsx).
NODES_PAGE = (
    "/api/hosts/?limit=12&offset=0&ordering=name",
    "/api/deployments/?limit=50&offset=0&ordering=name",
)
DASHBOARD = ("/api/fleet/summary/?top=10", "/api/hosts/?limit=24", "/api/deployments/?limit=24")


async def fleet_page_times(base: str, session: Any, reps: int) -> tuple[list[float], list[float]]:
    """The Nodes page's API calls (a page of hosts, a page of deployments) and the dashboard's (the fleet
    summary, a small page of each), each page's calls in parallel as the browser makes them."""
    async with session.get(base + "/api/auth/csrf/") as resp:
        csrf = (await resp.json())["csrfToken"]
    async with session.post(
        base + "/api/auth/login/",
        json={"username": "bench-admin", "password": ADMIN_PASSWORD},
        headers={"X-CSRFToken": csrf, "Referer": base + "/"},
    ) as resp:
        if resp.status != 200:
            raise SystemExit(f"admin login failed: {resp.status} {await resp.text()}")
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(reps):
        for paths, kept in ((NODES_PAGE, times[0]), (DASHBOARD, times[1])):
            started = time.monotonic()
            replies = await asyncio.gather(*(session.get(base + path) for path in paths))
            statuses = []
            for reply in replies:
                await reply.read()
                statuses.append(reply.status)
            if any(status != 200 for status in statuses):
                print(f"fleet page: HTTP {statuses} for {paths}", file=sys.stderr)
                continue
            kept.append(time.monotonic() - started)
            await asyncio.sleep(0.5)
    return times


async def scrape_metrics(base: str, session: Any, token: str) -> float | None:
    """One scrape of the fleet exposition as Prometheus makes it; its time to the last byte, or None
    when the answer is not a 200 gzip'd body."""
    headers = {"Authorization": f"Bearer {token}", "Accept-Encoding": "gzip"}
    started = time.monotonic()
    try:
        async with session.get(base + "/metrics", headers=headers) as resp:
            body = await resp.read()
            ok = resp.status == 200 and resp.headers.get("Content-Encoding") == "gzip"
            if not ok or body[:2] != b"\x1f\x8b":
                print(f"/metrics: HTTP {resp.status}, {len(body)} bytes", file=sys.stderr)
                return None
    except Exception as exc:
        print(f"/metrics: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None
    return time.monotonic() - started


async def metrics_times(base: str, token: str, reps: int, seconds: float) -> tuple[list[float], int]:
    """`reps` scrapes of /metrics spread evenly over `seconds`: their times and the failures."""
    import aiohttp

    times: list[float] = []
    failures = 0
    # The body is read as sent (gzip), not inflated: the time is the web process's answer.
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        for _ in range(reps):
            started = time.monotonic()
            took = await scrape_metrics(base, session, token)
            if took is None:
                failures += 1
            else:
                times.append(took)
            await asyncio.sleep(max(0.0, seconds / reps - (time.monotonic() - started)))
    return times, failures


async def run_step(
    agents: list[dict[str, Any]],
    stack: Stack,
    args: argparse.Namespace,
    base: str,
    pids: dict[str, list[int]],
) -> dict[str, Any]:
    import aiohttp

    stop, measuring = asyncio.Event(), asyncio.Event()
    stats = AgentStats()
    connector = aiohttp.TCPConnector(limit=0)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as admin,
    ):
        tasks = [
            asyncio.create_task(
                virtual_agent(
                    a,
                    base,
                    args.telemetry_seconds,
                    args.gpus,
                    stop,
                    measuring,
                    stats,
                    session,
                    n,
                    args.change_rate,
                )
            )
            for n, a in enumerate(agents)
        ]
        if args.metrics_reps:
            # Prometheus scrapes all the time: the web process has been scraped before the window.
            async with aiohttp.ClientSession(auto_decompress=False) as scraper:
                await scrape_metrics(base, scraper, stack.env["METRICS_TOKEN"])
        await asyncio.sleep(args.warmup)
        cpu0 = cpu_of(pids)
        me0 = time.process_time()
        redis0, (rows0, commits0) = redis_commands(stack.redis_port), pg_writes(stack)
        t0 = time.monotonic()
        measuring.set()
        page = asyncio.create_task(fleet_page_times(base, admin, args.page_reps))
        scrapes = asyncio.create_task(
            metrics_times(base, stack.env.get("METRICS_TOKEN", ""), args.metrics_reps, args.seconds)
        )
        ages: list[float] = []
        while time.monotonic() - t0 < args.seconds:
            await asyncio.sleep(1.0)
            ages += await asyncio.to_thread(live_ages, stack.redis_port, agents)
        page_times, dashboard_times = await page
        metric_times, metric_failures = await scrapes
        measuring.clear()
        wall = time.monotonic() - t0
        cpu1 = cpu_of(pids)
        me1 = time.process_time()
        redis1, (rows1, commits1) = redis_commands(stack.redis_port), pg_writes(stack)
        stop.set()
        await asyncio.gather(*tasks)
    engines = sum(len(a["deployments"]) for a in agents)
    return {
        "agents": len(agents),
        "engines": engines,
        "syncs_wanted_per_s": round(len(agents) / args.telemetry_seconds, 1),
        "syncs_per_s": round(len(stats.latencies) / wall, 1),
        "sync_p50_ms": round(percentile(stats.latencies, 0.5) * 1000, 1),
        "sync_p99_ms": round(percentile(stats.latencies, 0.99) * 1000, 1),
        "errors": stats.errors,
        # Answered by the ingest without Django (nodes/agent_ingest.py), and the web tier's CPU per sync.
        "routine_share": round(stats.routine / len(stats.latencies), 3) if stats.latencies else None,
        "web_cpu_ms_per_sync": round((cpu1["web"] - cpu0["web"]) * 1000 / len(stats.latencies), 2)
        if stats.latencies
        else None,
        "changes_sent": stats.changes_sent,
        "changes_acked": stats.changes_acked,
        "web_cores": round((cpu1["web"] - cpu0["web"]) / wall, 2),
        "proxies_cores": round((cpu1["proxies"] - cpu0["proxies"]) / wall, 2),
        "redis_cores": round((cpu1["redis"] - cpu0["redis"]) / wall, 2),
        "postgres_cores": round((cpu1["postgres"] - cpu0["postgres"]) / wall, 2),
        "load_generator_cores": round((me1 - me0) / wall, 2),
        "metrics_renderer_cores": round(
            (cpu1.get("metrics_renderer", 0.0) - cpu0.get("metrics_renderer", 0.0)) / wall, 2
        ),
        "db_rows_written_per_s": round((rows1 - rows0) / wall, 1),
        "db_commits_per_s": round((commits1 - commits0) / wall, 1),
        "redis_commands_per_s": round((redis1 - redis0) / wall, 1),
        "live_age_p50_s": round(percentile(ages, 0.5), 2),
        "live_age_p99_s": round(percentile(ages, 0.99), 2),
        "live_age_max_s": round(max(ages) if ages else float("nan"), 2),
        "fleet_page_p50_ms": round(statistics.median(page_times) * 1000, 1) if page_times else None,
        "fleet_page_max_ms": round(max(page_times) * 1000, 1) if page_times else None,
        "fleet_page_failures": args.page_reps - len(page_times),
        "dashboard_p50_ms": round(statistics.median(dashboard_times) * 1000, 1) if dashboard_times else None,
        "dashboard_max_ms": round(max(dashboard_times) * 1000, 1) if dashboard_times else None,
        "dashboard_failures": args.page_reps - len(dashboard_times),
        "metrics_p50_ms": round(percentile(metric_times, 0.5) * 1000, 1) if metric_times else None,
        "metrics_p95_ms": round(percentile(metric_times, 0.95) * 1000, 1) if metric_times else None,
        "metrics_max_ms": round(max(metric_times) * 1000, 1) if metric_times else None,
        "metrics_failures": metric_failures,
    }


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def cpu_of(pids: dict[str, list[int]]) -> dict[str, float]:
    # uvicorn --workers N: the workers are the master's children.
    found = {name: sum(cpu_seconds(c) for p in ps for c in (p, *children(p))) for name, ps in pids.items()}
    found["postgres"] = sum(cpu_seconds(p) for p in postgres_pids())
    return found


def postgres_pids() -> list[int]:
    """PostgreSQL's processes (the server is shared: its CPU includes whatever else runs on it)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() in ("postgres", "postgres:"):
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--engines", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per host")
    parser.add_argument("--proxies", type=int, default=4)
    parser.add_argument("--steps", default="", help="comma-separated agent counts (default: just --agents)")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=8.0)
    parser.add_argument("--telemetry-seconds", type=float, default=1.0, help="as NODE_TELEMETRY_SECONDS")
    parser.add_argument("--page-reps", type=int, default=5)
    parser.add_argument(
        "--metrics-reps",
        type=int,
        default=0,
        help="scrape the fleet exposition /metrics this many times during the measured window (0: never)",
    )
    parser.add_argument(
        "--change-rate",
        type=float,
        default=0.01,
        help="chance per sync that an agent reports an engine degraded, then ready (0: routine syncs only)",
    )
    parser.add_argument(
        "--web-workers",
        type=int,
        default=1,
        help="uvicorn worker processes (make run: WEB_WORKERS, one per core)",
    )
    parser.add_argument("--postgres", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--json", default="", help="also write the results here")
    args = parser.parse_args()
    steps = [int(s) for s in args.steps.split(",") if s] or [args.agents]
    if max(steps) > args.agents:
        raise SystemExit("--steps may not exceed --agents")

    stack = bring_up(args)
    if args.metrics_reps:
        # The scrape must pass the token check as Prometheus does (core/metrics_access.py); this process
        # keeps it for the run only.
        stack.env["METRICS_TOKEN"] = secrets.token_urlsafe(24)
    try:
        agents = build_fleet(args)
        web_port = free_port()
        stack.env["NODE_TELEMETRY_SECONDS"] = str(args.telemetry_seconds)
        web = stack.start(
            "web",
            [
                str(Path(PYTHON).parent / "uvicorn"),
                "inferchain.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(web_port),
                "--loop",
                "uvloop",
                "--http",
                "httptools",
                "--no-access-log",
                "--workers",
                str(args.web_workers),
            ],
        )
        base = f"http://127.0.0.1:{web_port}"
        wait_http(base + "/api/auth/csrf/", 60, web, stack.tmp / "web.log")
        proxies = []
        for n in range(args.proxies):
            port = free_port()
            proxy = stack.start(f"proxy{n}", [PYTHON, "-m", "routing.proxy", "--port", str(port)])
            wait_http(f"http://127.0.0.1:{port}/healthz", 60, proxy, stack.tmp / f"proxy{n}.log")
            proxies.append(proxy.pid)
        redis_pid = next(p.pid for name, p, _ in stack.procs if name == "redis")
        pids = {"web": [web.pid], "proxies": proxies, "redis": [redis_pid]}
        if args.metrics_reps:
            # The Celery worker's beat task that renders /metrics ahead (routing.refresh_fleet_metrics,
            # every second), standing in for the worker this benchmark does not run; its CPU is printed.
            renderer = stack.start("metrics-renderer", [PYTHON, "-c", RENDERER])
            pids["metrics_renderer"] = [renderer.pid]
        results = []
        for count in steps:
            row = asyncio.run(run_step(agents[:count], stack, args, base, pids))
            results.append(row)
            print(json.dumps(row), flush=True)
        print()
        print(
            "| agents | engines | syncs/s (asked) | sync p50 / p99 | web CPU | proxies CPU | Redis CPU "
            "| PostgreSQL CPU | DB rows written/s (commits/s) | Redis cmds/s | live age p50 / p99 "
            "| Nodes page p50 (max) | dashboard p50 (max) | /metrics p50 / p95 (max) |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in results:
            print(
                f"| {r['agents']} | {r['engines']} | {r['syncs_per_s']} ({r['syncs_wanted_per_s']}) "
                f"| {r['sync_p50_ms']} / {r['sync_p99_ms']} ms | {r['web_cores']} | {r['proxies_cores']} "
                f"| {r['redis_cores']} | {r['postgres_cores']} | {r['db_rows_written_per_s']} "
                f"({r['db_commits_per_s']}) | {r['redis_commands_per_s']} "
                f"| {r['live_age_p50_s']} / {r['live_age_p99_s']} s "
                f"| {r['fleet_page_p50_ms']} ({r['fleet_page_max_ms']}) ms "
                f"| {r['dashboard_p50_ms']} ({r['dashboard_max_ms']}) ms "
                + (
                    f"| {r['metrics_p50_ms']} / {r['metrics_p95_ms']} ({r['metrics_max_ms']}) ms"
                    f"{f', {failed} failed' if (failed := r['metrics_failures']) else ''} |"
                    if args.metrics_reps
                    else "| - |"
                )
            )
        if args.json:
            Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2) + "\n")
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
