"""GPU sample -> WebSocket client latency of the live feed, through the real processes.

    .venv/bin/python benchmarks/live_feed_latency.py [--seconds 30]

One simulated engine on a simulated host; the agent's supervisor loop (the code `run_agent` runs)
samples GPUs and engine metrics once a second and pushes `host.telemetry` events through the
Redis channel layer to the console (uvicorn, inferchain.asgi) and on to a signed-in WebSocket client
in this process. For each event the delay is arrival time minus the event's `ts` (the GPU sample
time, same clock). Median, p95 and max on stdout; JSON in var/bench/live_feed_latency.json.
Needs Redis (REDIS_URL); keeps everything else (SQLite, logs, model files) in a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from simhost import sim_host_engine  # noqa: E402 - this folder's, as the other benchmarks import theirs

from vllm_sim.testing import free_port  # noqa: E402 - after the path it is found on

BENCH_DIR = REPO / "var" / "bench"


def configure(tmp: Path) -> dict[str, str]:
    """Environment shared by this process and the console subprocess; set before Django starts."""
    env = {
        "DJANGO_SETTINGS_MODULE": "inferchain.settings",
        "DATABASE_URL": f"sqlite:///{tmp / 'db.sqlite3'}",
        "REDIS_KEY_PREFIX": f"benchlive{os.getpid()}:",
        "SECRET_KEY": secrets.token_urlsafe(40),
        "ENGINE_LOG_DIR": str(tmp / "engines"),
        "MODEL_ROOTS": str(tmp / "models"),
        "NODE_TELEMETRY_SECONDS": "1.0",
    }
    os.environ.update(env)
    return env


def signed_in_cookie() -> str:
    """A session for a fresh viewer, created directly in the session store (no login round trip)."""
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.sessions.backends.db import SessionStore

    from console.models import User

    user = User.objects.create_user(
        username="bench-viewer", password=secrets.token_urlsafe(16), role="viewer"
    )
    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    return f"sessionid={session.session_key}"


def start_engine(tmp: Path) -> Any:
    """A host with one simulated H100 and one ready simulated engine; returns the supervisor."""
    from nodes.agent import runtime
    from nodes.choices import DeploymentState

    supervisor, deployment = sim_host_engine(tmp, "llama-3.1-8b")
    runtime.launch(deployment.pk)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        supervisor.tick()
        deployment.refresh_from_db()
        if deployment.state == DeploymentState.READY:
            return supervisor
        time.sleep(0.2)
    raise SystemExit(f"engine did not become ready: {deployment.state} {deployment.state_reason}")


def start_console(env: dict[str, str], tmp: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    log = (tmp / "console.log").open("wb")
    argv = [sys.executable, "-m", "uvicorn", "inferchain.asgi:application", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--loop", "uvloop", "--http", "httptools", "--log-level", "warning"]
    proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/auth/csrf/", timeout=1).read()
            return proc, port
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("console did not start; see " + str(tmp / "console.log"))


async def collect(port: int, cookie: str, seconds: float) -> list[float]:
    from websockets.asyncio.client import connect

    delays: list[float] = []
    async with connect(
        f"ws://127.0.0.1:{port}/ws/live/",
        additional_headers={"Cookie": cookie},
        origin=f"http://127.0.0.1:{port}",  # type: ignore[arg-type]
    ) as socket_:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                raw = await asyncio.wait_for(socket_.recv(), timeout=max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                break
            arrived = time.time()
            event = json.loads(raw)
            if event.get("type") == "host.telemetry":
                delays.append((arrived - float(event["ts"])) * 1000)
    return delays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    options = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="live-feed-bench-"))
    env = configure(tmp)
    sys.path.insert(0, str(REPO))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    cookie = signed_in_cookie()
    supervisor = start_engine(tmp)
    console, port = start_console(env, tmp)
    loop = threading.Thread(target=supervisor.run, daemon=True)
    loop.start()
    try:
        delays = asyncio.run(collect(port, cookie, options.seconds))
    finally:
        supervisor.close()
        console.terminate()
        console.wait(10)
        from nodes import process
        from nodes.models import Deployment

        for deployment in Deployment.objects.filter(pid__isnull=False):
            process.stop_engine(deployment.pid, timeout=5)  # type: ignore[arg-type]
        from core.redis_client import get_redis

        redis = get_redis()
        for key in redis.scan_iter(match=f"{env['REDIS_KEY_PREFIX']}*", count=500):
            redis.delete(key)
    if not delays:
        raise SystemExit("no telemetry events arrived")
    delays.sort()
    result = {
        "events": len(delays),
        "median_ms": round(statistics.median(delays), 2),
        "p95_ms": round(delays[min(len(delays) - 1, int(0.95 * len(delays)))], 2),
        "max_ms": round(delays[-1], 2),
        "telemetry_interval_s": 1.0,
    }
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    (BENCH_DIR / "live_feed_latency.json").write_text(json.dumps(result, indent=2))
    print("| events | median | p95 | max |\n|---|---|---|---|")
    print(
        f"| {result['events']} | {result['median_ms']} ms | {result['p95_ms']} ms | {result['max_ms']} ms |"
    )


if __name__ == "__main__":
    main()
