"""Proxy overhead and throughput, side by side in one run: direct, inferchain proxy, LiteLLM proxy.

    .venv/bin/python benchmarks/proxy_overhead.py [--seconds 5] [--reps 3] [--skip-litellm]
        [--keys quota,noquota] [--compare-tree ../before]

All targets front the same trivial OpenAI-compatible backend (benchmarks/trivial_backend.py)
on loopback. For each target: latency at 1 client (p50, p99 of sequential requests) and requests/s
at 16 and 64 concurrent clients, non-streaming and streaming, and the proxy's CPU time per request
(user + system of its processes, from /proc); each cell runs `--seconds` and is repeated `--reps`
times, the reps interleaved across targets (direct, inferchain, inferchain without quota, LiteLLM,
direct, ...) so that a change in the shared machine's load hits every target alike, and the median is
reported. The inferchain proxy runs standalone (`python -m routing.proxy`, one worker, its own HTTP
server on uvloop + httptools; `--proxy-server uvicorn` for comparison) with a scratch PostgreSQL
database holding its keys and request log (`--db sqlite` for the demo's SQLite). It is measured as
a tenant with a quota (`inferchain`: every counted limit set, far above the load, the path real
tenants take) and, on the same process, as a tenant without one (`inferchain-noquota`: no Redis call).
A bare aiohttp pass-through (`passthrough`, benchmarks/passthrough.py: forwards and nothing else) is
the reference row: what one Python process that only forwards reaches on the same cores.
LiteLLM is installed pinned into its own virtualenv (var/bench/litellm-venv) and runs configured as
its production documentation recommends for speed (`litellm_config`: a model it knows, no callbacks,
no retries, no verbose logging, no spend or error logs, no database), one worker by default
(`--litellm-workers`). Every target first gets `--warmup` seconds of traffic, so that one-off costs
of first requests (LiteLLM imports modules on its first calls) stay out of the cells.
Results: a Markdown table on stdout and JSON (with every rep) in var/bench/.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
BENCH_DIR = REPO / "var" / "bench"
LITELLM_VERSION = "1.108.0"
LITELLM_VENV = BENCH_DIR / "litellm-venv"
BODY = {"model": "trivial", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(
    url: str, proc: subprocess.Popen[bytes], timeout: float = 90.0, headers: dict[str, str] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited with {proc.returncode}")
        try:
            req = urllib.request.Request(url, headers=headers or {})
            with urllib.request.urlopen(req, timeout=2) as resp:
                if resp.status < 500:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url}: not ready after {timeout}s")


# With --pin: the CPUs of the backend and of the proxies (the load generator pins itself with the backend).
PIN: dict[str, set[int]] = {}


def spawn(
    cmd: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path = REPO, role: str = "proxy"
) -> subprocess.Popen[bytes]:
    fh = log.open("wb")
    cpus = PIN.get(role)
    return subprocess.Popen(
        cmd,
        cwd=cwd,
        stdout=fh,
        stderr=subprocess.STDOUT,
        env=env or dict(os.environ),
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


# ---- targets ---------------------------------------------------------------------------------------


# The quota the benchmark tenant gets: every counted limit set (so admission runs the whole limiter
# script and completion its whole true-up), each far above anything one machine can send, so nothing
# is ever refused. Real tenants have quotas (the demo's does); a tenant without one skips Redis.
BENCH_QUOTA = {
    "requests_per_minute": 1_000_000,
    "tokens_per_minute": 1_000_000_000,
    "max_concurrent_requests": 100_000,
    "daily_token_budget": 10**15,
}


def setup_inferchain_db(db_url: str) -> dict[str, str]:
    """Migrate the benchmark proxy's database and issue two keys; returns their raw keys by name.

    `quota`: a tenant with `BENCH_QUOTA` (the path real tenants take); `noquota`: a tenant with no
    counted limit, for which the proxy makes no Redis call at all.
    """
    env = {**os.environ, "DATABASE_URL": db_url, "DJANGO_SETTINGS_MODULE": "inferchain.settings"}
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=REPO, env=env, check=True
    )
    script = (
        "import json, django; django.setup()\n"
        "from console.models import Quota, Tenant\n"
        "from console.services import issue_api_key\n"
        "keys = {}\n"
        "for name, quota in (('quota', json.loads(QUOTA)), ('noquota', None)):\n"
        "    t, _ = Tenant.objects.get_or_create(name='bench-' + name)\n"
        "    if quota:\n"
        "        Quota.objects.update_or_create(tenant=t, defaults=quota)\n"
        "    keys[name] = issue_api_key(tenant=t, name='bench').raw_key\n"
        "print(json.dumps(keys))\n"
    ).replace("QUOTA", repr(json.dumps(BENCH_QUOTA)))
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, check=True, capture_output=True)
    return dict(json.loads(out.stdout.decode().strip().splitlines()[-1]))


@contextlib.contextmanager
def bench_database(kind: str, name: str) -> Iterator[str]:
    """A scratch database for a benchmark proxy's keys and request log, dropped afterwards.

    `postgres` (the default) is how the proxy is deployed: its request log goes to PostgreSQL by COPY.
    `sqlite` is the zero-setup demo's database, written from the proxy process itself.
    """
    if kind == "sqlite":
        path = BENCH_DIR / f"{name}.sqlite3"
        path.unlink(missing_ok=True)
        yield f"sqlite:///{path}"
        return
    import psycopg

    admin = os.environ.get("BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    dbname = f"inferchain_bench_{name}_{os.getpid()}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}"')
        conn.execute(f'CREATE DATABASE "{dbname}"')
    try:
        yield admin.rsplit("/", 1)[0] + "/" + dbname
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def litellm_config(backend_port: int) -> str:
    """LiteLLM's config as its production documentation recommends for speed (docs.litellm.ai
    /docs/proxy/prod and /docs/benchmarks): a model it knows (`openai/gpt-4o-mini`, so its model map,
    cost and token helpers find it) pointed at the same backend, no callbacks, no retries, no verbose
    logging, no spend or error logs (and no database at all), telemetry off."""
    return (
        "model_list:\n"
        "  - model_name: trivial\n"
        "    litellm_params:\n"
        "      model: openai/gpt-4o-mini\n"
        f"      api_base: http://127.0.0.1:{backend_port}/v1\n"
        "      api_key: unused\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
        "  set_verbose: false\n"
        "  callbacks: []\n"
        "  num_retries: 0\n"
        "  request_timeout: 600\n"
        "general_settings:\n"
        "  disable_spend_logs: true\n"
        "  disable_error_logs: true\n"
    )


def ensure_litellm() -> tuple[Path | None, str]:
    """The LiteLLM executable in its own virtualenv (installed pinned if missing), or why not."""
    exe = LITELLM_VENV / "bin" / "litellm"
    if exe.exists():
        return exe, ""
    try:
        subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
        subprocess.run(
            [str(LITELLM_VENV / "bin" / "pip"), "install", "--quiet", f"litellm[proxy]=={LITELLM_VERSION}"],
            check=True,
            timeout=900,
        )
    except (subprocess.SubprocessError, OSError) as exc:
        return None, f"install failed: {exc}"
    return (exe, "") if exe.exists() else (None, "installed but no litellm executable")


# ---- load ------------------------------------------------------------------------------------------


TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process, all its threads, from /proc (0 once it has gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU time of `pid` and its live descendants (threads included), from /proc."""
    total = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        total += cpu_seconds(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return total


def pids_named(*names: str) -> list[int]:
    """Every live process whose command name is one of `names` (PostgreSQL's backends, redis-server)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() in names:
                    pids.append(int(entry.name))
    return pids


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (every core, all but idle and iowait), from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICK


# The processes whose CPU each cell also counts, besides the target's own: set by measure().
ACCOUNTED: dict[str, int] = {}


def accounts() -> dict[str, float]:
    """CPU seconds so far of: the machine, this load generator, the backend, PostgreSQL, Redis.

    Where a request's CPU goes on the shared cores beyond the proxy's own: a direct call costs the
    client and the backend; a proxied one adds the proxy, the database's inserts of the request log,
    Redis's grants, and the kernel's second loopback hop (in the machine's total; part of it is
    charged to whichever process was on the core)."""
    own = os.times()
    return {
        "machine": machine_busy_seconds(),
        "client": own.user + own.system,
        "backend": tree_cpu_seconds(ACCOUNTED["backend"]) if "backend" in ACCOUNTED else 0.0,
        # Each process once, by its own time: the postmaster is named "postgres" too, and its tree
        # holds every backend, so summing trees counted PostgreSQL's work twice (until 2026-12-04).
        "postgres": sum(cpu_seconds(p) for p in pids_named("postgres")),
        "redis": sum(cpu_seconds(p) for p in pids_named("redis-server")),
    }


async def run_cell(
    url: str, key: str, clients: int, seconds: float, stream: bool, pid: int | None = None
) -> dict[str, float]:
    """`clients` loops sending requests back to back for `seconds`; requests/s, latency percentiles,
    with `pid` the CPU time of that process tree per request (warm-up excluded), and the CPU per
    request of the machine and of each other process that serves it (`accounts`, `<name>_us`)."""
    body = json.dumps({**BODY, "stream": stream}).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def one() -> None:
            nonlocal errors
            t0 = time.perf_counter()
            async with session.post(url, data=body) as resp:
                payload = await resp.read()
                if resp.status != 200 or (stream and b"[DONE]" not in payload):
                    errors += 1
                    return
            latencies.append(time.perf_counter() - t0)

        for _ in range(min(clients, 8) * 5):  # warm connections and caches
            await one()
        latencies.clear()
        errors = 0
        cpu_before = tree_cpu_seconds(pid) if pid else 0.0
        accounts_before = accounts()
        stop_at = time.perf_counter() + seconds

        async def loop() -> None:
            while time.perf_counter() < stop_at:
                await one()

        started = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(clients)))
        elapsed = time.perf_counter() - started
        cpu = tree_cpu_seconds(pid) - cpu_before if pid else float("nan")
        spent = {name: v - accounts_before[name] for name, v in accounts().items()}
    latencies.sort()
    n = len(latencies)
    return {
        **{f"{name}_us": v / (n + errors) * 1e6 if n + errors else float("nan") for name, v in spent.items()},
        "rps": n / elapsed,
        "p50_ms": latencies[n // 2] * 1000 if n else float("nan"),
        "p99_ms": latencies[min(n - 1, int(n * 0.99))] * 1000 if n else float("nan"),
        "cpu_us": cpu / (n + errors) * 1e6 if n + errors else float("nan"),
        "requests": n,
        "errors": errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--skip-litellm", action="store_true")
    parser.add_argument(
        "--skip-passthrough",
        action="store_true",
        help="leave out the reference row: a bare aiohttp pass-through (benchmarks/passthrough.py)",
    )
    parser.add_argument(
        "--litellm-workers",
        type=int,
        default=1,
        help="LiteLLM's --num_workers (default 1, as the inferchain proxy's default here)",
    )
    parser.add_argument(
        "--warmup", type=float, default=4.0, help="seconds of traffic per target before the cells"
    )
    parser.add_argument(
        "--keys",
        type=lambda v: v.split(","),
        default=["quota", "noquota"],
        help="inferchain tenants to measure: quota (limits far above the load; the default row), noquota",
    )
    parser.add_argument(
        "--proxy-workers", type=int, default=1, help="worker processes of the inferchain proxy (default 1)"
    )
    parser.add_argument(
        "--proxy-server",
        choices=("inferchain", "uvicorn"),
        default="inferchain",
        help="the proxy's HTTP server (python -m routing.proxy --server; default inferchain)",
    )
    parser.add_argument(
        "--db",
        choices=("postgres", "sqlite"),
        default="postgres",
        help="where the proxy's keys and request log live (default postgres, as deployed)",
    )
    parser.add_argument(
        "--compare-tree",
        type=Path,
        default=None,
        help="another checkout of this repository (e.g. `git worktree add ../before main`): its proxy runs "
        "beside this one, on the same database and keys, as targets `before` and `before-noquota`, and "
        "a table of this tree / that tree per cell follows",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the load generator and the backend on CPU 0, every proxy on CPU 1 (PostgreSQL and Redis where "
        "the system puts them): each proxy with a core of its own, as on a host of its own, instead of "
        "all sharing every core",
    )
    args = parser.parse_args()
    if args.pin:
        if len(os.sched_getaffinity(0)) < 2:
            parser.error("--pin needs two CPUs")
        first, second = sorted(os.sched_getaffinity(0))[:2]
        PIN.update(backend={first}, proxy={second})
        os.sched_setaffinity(0, {first})
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass

    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    with bench_database(args.db, "overhead") as db_url:
        results = measure(args, db_url)
    results["pinned"] = {role: sorted(cpus) for role, cpus in PIN.items()}
    label = f"w{args.proxy_workers}" + ("" if args.proxy_server == "inferchain" else f"-{args.proxy_server}")
    label += "-pinned" if args.pin else ""
    out = BENCH_DIR / f"proxy_overhead_{label}.json"
    out.write_text(json.dumps(results, indent=2))
    print()
    print(render_table(results))
    print(f"\nraw results: {out}")


def measure(args: argparse.Namespace, db_url: str) -> dict[str, Any]:
    logs = Path(tempfile.mkdtemp(prefix="proxy-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    results: dict[str, Any] = {
        "seconds": args.seconds,
        "reps": args.reps,
        "proxy_workers": args.proxy_workers,
        "proxy_server": args.proxy_server,
        "db": args.db,
        "load_average_start": os.getloadavg()[0],
        "targets": {},
        "runs": {},
        "notes": {},
    }
    try:
        backend_port = free_port()
        procs.append(
            spawn(
                [sys.executable, "benchmarks/trivial_backend.py", "--port", str(backend_port)],
                logs / "backend.log",
                role="backend",
            )
        )
        wait_ready(f"http://127.0.0.1:{backend_port}/health", procs[-1])
        ACCOUNTED["backend"] = procs[-1].pid
        # name -> (url, key, pid of the process whose CPU is counted, or None)
        targets: dict[str, tuple[str, str, int | None]] = {
            "direct": (f"http://127.0.0.1:{backend_port}/v1/chat/completions", "unused", None),
        }

        raw_keys = setup_inferchain_db(db_url)
        proxy_port = free_port()
        env = {
            **os.environ,
            "DATABASE_URL": db_url,
            "PROXY_STATIC_ENDPOINTS": f"trivial=http://127.0.0.1:{backend_port}",
            "REDIS_KEY_PREFIX": f"bench{os.getpid()}:",
            "REQUEST_LOG_SPOOL_DIR": str(logs / "spool"),
        }
        procs.append(
            spawn(
                [
                    *(sys.executable, "-m", "routing.proxy", "--port", str(proxy_port)),
                    *("--workers", str(args.proxy_workers), "--server", args.proxy_server),
                ],
                logs / "proxy.log",
                env,
            )
        )
        wait_ready(f"http://127.0.0.1:{proxy_port}/healthz", procs[-1])
        for key_name in args.keys:
            name = "inferchain" if key_name == "quota" else f"inferchain-{key_name}"
            targets[name] = (
                f"http://127.0.0.1:{proxy_port}/v1/chat/completions",
                raw_keys[key_name],
                procs[-1].pid,
            )
        if not args.skip_passthrough:
            bare_port = free_port()
            procs.append(
                spawn(
                    [
                        *(sys.executable, "benchmarks/passthrough.py", "--port", str(bare_port)),
                        *("--upstream", f"http://127.0.0.1:{backend_port}"),
                    ],
                    logs / "passthrough.log",
                )
            )
            wait_ready(f"http://127.0.0.1:{bare_port}/healthz", procs[-1])
            targets["passthrough"] = (
                f"http://127.0.0.1:{bare_port}/v1/chat/completions",
                "unused",
                procs[-1].pid,
            )
        if args.compare_tree is not None:
            tree = args.compare_tree.resolve()
            before_port = free_port()
            procs.append(
                spawn(
                    [
                        *(sys.executable, "-m", "routing.proxy", "--port", str(before_port)),
                        *("--workers", str(args.proxy_workers), "--server", args.proxy_server),
                    ],
                    logs / "proxy-before.log",
                    {
                        **env,
                        "PYTHONPATH": str(tree),
                        "REDIS_KEY_PREFIX": f"bench{os.getpid()}before:",
                        # The keys were hashed with this tree's secret (var/secret_key unless set).
                        "SECRET_KEY_FILE": os.environ.get(
                            "SECRET_KEY_FILE", str(REPO / "var" / "secret_key")
                        ),
                    },
                    cwd=tree,
                )
            )
            wait_ready(f"http://127.0.0.1:{before_port}/healthz", procs[-1])
            results["notes"]["compare_tree"] = str(tree)
            for key_name in args.keys:
                name = "before" if key_name == "quota" else f"before-{key_name}"
                targets[name] = (
                    f"http://127.0.0.1:{before_port}/v1/chat/completions",
                    raw_keys[key_name],
                    procs[-1].pid,
                )

        if not args.skip_litellm:
            exe, why = ensure_litellm()
            if exe is None:
                results["notes"]["litellm"] = why
            else:
                litellm_port = free_port()
                cfg = logs / "litellm.yaml"
                cfg.write_text(litellm_config(backend_port))
                results["notes"]["litellm_config"] = litellm_config(backend_port)
                results["notes"]["litellm_workers"] = args.litellm_workers
                lenv = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL",)}
                lenv["LITELLM_LOG"] = "ERROR"
                # LiteLLM refuses to start without a master key; it authenticates with it (no database).
                master_key = "sk-" + secrets.token_hex(16)
                lenv["LITELLM_MASTER_KEY"] = master_key
                procs.append(
                    spawn(
                        [
                            *(str(exe), "--config", str(cfg), "--port", str(litellm_port)),
                            *("--num_workers", str(args.litellm_workers)),
                        ],
                        logs / "litellm.log",
                        lenv,
                    )
                )
                try:
                    wait_ready(f"http://127.0.0.1:{litellm_port}/health/liveliness", procs[-1], timeout=180)
                    targets["litellm"] = (
                        f"http://127.0.0.1:{litellm_port}/v1/chat/completions",
                        master_key,
                        procs[-1].pid,
                    )
                except RuntimeError as exc:
                    tail = (logs / "litellm.log").read_text(errors="replace")[-1500:]
                    results["notes"]["litellm"] = f"{exc}; log tail: {tail}"

        # Each target's first requests pay one-off costs (LiteLLM imports modules and builds clients
        # on its first calls; the proxy fills its key cache and connection pools): paid here, not in a cell.
        for url, key, _pid in targets.values():
            asyncio.run(run_cell(url, key, 16, args.warmup, False))
            asyncio.run(run_cell(url, key, 16, args.warmup / 2, True))
        cells = [(1, False), (16, False), (64, False), (1, True), (16, True), (64, True)]
        for name in targets:
            results["targets"][name] = {}
            results["runs"][name] = {}
        for clients, stream in cells:
            label = f"{'stream' if stream else 'json'}_c{clients}"
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in targets}
            # Reps interleaved across targets: a change in the shared machine's load hits all of them.
            for _ in range(args.reps):
                for name, (url, key, pid) in targets.items():
                    runs[name].append(asyncio.run(run_cell(url, key, clients, args.seconds, stream, pid)))
            for name, cell_runs in runs.items():
                cell = {k: statistics.median(r[k] for r in cell_runs) for k in cell_runs[0]}
                results["targets"][name][label] = cell
                results["runs"][name][label] = cell_runs
                print(
                    f"{name:18s} {label:10s} {cell['rps']:8.0f} req/s  p50 {cell['p50_ms']:6.2f} ms  "
                    f"p99 {cell['p99_ms']:6.2f} ms  CPU {cell['cpu_us']:6.0f} us/req  "
                    f"errors {cell['errors']:.0f}",
                    flush=True,
                )
    finally:
        for proc in reversed(procs):
            stop(proc)
    results["load_average_end"] = os.getloadavg()[0]
    return results


CELLS = ("json_c1", "json_c16", "json_c64", "stream_c1", "stream_c16", "stream_c64")


def _per_rep_ratio(results: dict[str, Any], a: str, b: str, label: str, field: str) -> float:
    """Median over reps of a's figure / b's figure in the same rep (the two ran back to back)."""
    ra, rb = results["runs"][a][label], results["runs"][b][label]
    return statistics.median(x[field] / y[field] for x, y in zip(ra, rb, strict=True) if y[field])


def render_table(results: dict[str, Any]) -> str:
    t = results["targets"]
    names = [n for n in t if n != "direct" and "direct" in t]
    lines = [
        "| cell | direct | " + " | ".join(names) + " |",
        "|---|---:|" + "---:|" * len(names),
    ]
    for label in CELLS:
        if label not in t.get("direct", {}):
            continue
        cells = []
        for name in names:
            o = t[name].get(label)
            ratio = _per_rep_ratio(results, name, "direct", label, "rps") if o else float("nan")
            cells.append(f"{o['rps']:.0f} ({ratio:.2f})" if o else "n/a")
        lines.append(
            f"| {label} req/s (vs direct) | {t['direct'][label]['rps']:.0f} | " + " | ".join(cells) + " |"
        )
    for label in ("json_c1", "stream_c1"):
        if label not in t.get("direct", {}):
            continue
        d = t["direct"][label]
        for pct in ("p50_ms", "p99_ms"):
            cells = [
                f"{t[n][label][pct]:.2f} (+{t[n][label][pct] - d[pct]:.2f})" for n in names if label in t[n]
            ]
            lines.append(f"| {label} {pct} (added) | {d[pct]:.2f} | " + " | ".join(cells) + " |")
    for label in CELLS:
        cells = [f"{t[n][label]['cpu_us']:.0f}" if label in t[n] else "n/a" for n in names]
        if any(c != "n/a" for c in cells):
            lines.append(f"| {label} proxy CPU us/request | | " + " | ".join(cells) + " |")
    # Where the machine's CPU goes per request, by process: on shared cores a target's throughput is
    # bounded by the whole sum, not by the proxy's share alone.
    parts = ("client", "backend", "postgres", "redis")
    if "machine_us" in t.get("direct", {}).get("json_c16", {}):
        lines.append("")
        lines.append(
            "| cell | target | machine CPU us/request | client | backend | proxy | postgres | redis | "
            "rest (kernel, other processes) |"
        )
        lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for label in CELLS:
            for name in ["direct", *names]:
                o = t[name].get(label)
                if not o or "machine_us" not in o:
                    continue
                proxy = 0.0 if name == "direct" else o["cpu_us"]
                rest = o["machine_us"] - proxy - sum(o[f"{k}_us"] for k in parts)
                lines.append(
                    f"| {label} | {name} | {o['machine_us']:.0f} | "
                    + " | ".join(f"{o[f'{k}_us']:.0f}" for k in parts[:2])
                    + f" | {proxy:.0f} | "
                    + " | ".join(f"{o[f'{k}_us']:.0f}" for k in parts[2:])
                    + f" | {rest:.0f} |"
                )
    # Ratios of targets measured in the same reps: what the quota costs, and each tenant against the
    # bare pass-through (the figures docs/benchmarks.md quotes).
    for a, b, name in (
        ("inferchain", "inferchain-noquota", "quota / no quota"),
        ("inferchain", "passthrough", "quota / pass-through"),
        ("inferchain-noquota", "passthrough", "no quota / pass-through"),
    ):
        if a not in t or b not in t:
            continue
        lines.append("")
        lines.append(f"| cell | {name} CPU per request | {name} req/s |")
        lines.append("|---|---:|---:|")
        for label in CELLS:
            if label in t[a] and label in t[b]:
                cpu = _per_rep_ratio(results, a, b, label, "cpu_us")
                rps = _per_rep_ratio(results, a, b, label, "rps")
                lines.append(f"| {label} | {cpu:.2f} | {rps:.2f} |")
    pairs = [
        (a, b) for a, b in (("inferchain", "before"), ("inferchain-noquota", "before-noquota")) if b in t
    ]
    if pairs:
        lines.append("")
        lines.append(
            "| tenant | cell | CPU us/request this tree | compare tree | ratio | p50 ms this tree | "
            "compare tree | ratio | req/s ratio |"
        )
        lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for a, b in pairs:
            for label in CELLS:
                if label not in t[a] or label not in t[b]:
                    continue
                cpu = _per_rep_ratio(results, a, b, label, "cpu_us")
                p50 = _per_rep_ratio(results, a, b, label, "p50_ms")
                rps = _per_rep_ratio(results, a, b, label, "rps")
                tenant = "quota" if a == "inferchain" else "no quota"
                lines.append(
                    f"| {tenant} | {label} | {t[a][label]['cpu_us']:.0f} | "
                    f"{t[b][label]['cpu_us']:.0f} | {cpu:.3f} | {t[a][label]['p50_ms']:.2f} | "
                    f"{t[b][label]['p50_ms']:.2f} | {p50:.3f} | {rps:.3f} |"
                )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
