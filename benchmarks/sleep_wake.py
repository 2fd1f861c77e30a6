"""The extra latency of a request that wakes a level-1 sleeper, against a cold start, through the real path.

    .venv/bin/python benchmarks/sleep_wake.py [--reps 5]

One simulated engine (H100 + Llama-3.1-8B fp16 profile, real time: the simulator's modelled level-1
wake-up copies 16 GB of weights back over PCIe Gen5, about 0.37 s) launched by the agent's own code
with sleep mode, the agent's supervisor loop at the product's default 1 s tick, and a proxy process.
Each rep, interleaved:
  - awake: one chat request (max_tokens 1) through the proxy to the ready engine;
  - wake: the agent puts the engine to sleep at level 1 (runtime.sleep), the proxy's snapshot follows,
    then the same request: the proxy holds it, sets the wake key, the agent's next tick wakes the
    engine (POST /wake_up, confirmed with /is_sleeping), the proxy routes it;
  - cold: the agent stops the engine, then launches it again (runtime.launch) and the same request is
    sent every 50 ms until one succeeds: process start, simulator start-up, readiness probes, ready.
Extra latency = median(wake) - median(awake) and median(cold) - median(awake). The simulator loads no
weights at start-up, so its cold start is far shorter than a real vLLM's (30-100+ s: vLLM's sleep-mode
blog post); the wake side is modelled on the real copy. Medians on stdout; JSON in
var/bench/sleep_wake.json. Needs Redis (REDIS_URL); SQLite and engine logs in a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from simhost import sim_host_engine  # noqa: E402 - this folder's, as the other benchmarks import theirs

from vllm_sim.testing import free_port  # noqa: E402 - after the path it is found on

BENCH_DIR = REPO / "var" / "bench"
ALIAS = "llama-3.1-8b"


def configure(tmp: Path) -> dict[str, str]:
    env = {
        "DJANGO_SETTINGS_MODULE": "inferchain.settings",
        "DATABASE_URL": f"sqlite:///{tmp / 'db.sqlite3'}",
        "REDIS_KEY_PREFIX": f"benchsleep{os.getpid()}:",
        "SECRET_KEY": secrets.token_urlsafe(40),
        "API_KEY_HMAC_SECRET": secrets.token_urlsafe(40),
        "ENGINE_LOG_DIR": str(tmp / "engines"),
        "MODEL_ROOTS": str(tmp / "models"),
        "REQUEST_LOG_SPOOL_DIR": str(tmp / "spool"),
        "NODE_TELEMETRY_SECONDS": "1.0",
    }
    os.environ.update(env)
    return env


def make_engine(tmp: Path) -> tuple[Any, int]:
    """A host with one simulated H100 and one sleep-capable simulated engine (not launched yet)."""
    supervisor, deployment = sim_host_engine(tmp, ALIAS, sleep_enabled=True)
    return supervisor, deployment.pk


def start_proxy(env: dict[str, str], tmp: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    log = (tmp / "proxy.log").open("wb")
    argv = [sys.executable, "-m", "routing.proxy", "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).read()
            return proc, port
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("proxy did not start; see " + str(tmp / "proxy.log"))


def chat(port: int, key: str) -> int:
    body = json.dumps(
        {"model": ALIAS, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    ).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def wait_state(deployment_id: int, state: str, timeout: float = 60.0) -> None:
    from nodes.models import Deployment

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if Deployment.objects.get(pk=deployment_id).state == state:
            return
        time.sleep(0.05)
    raise SystemExit(f"deployment did not reach {state}")


def wait_listed(port: int, key: str, timeout: float = 30.0) -> None:
    """Until the proxy's snapshot has the engine (it reloads on the ready state's config change)."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {key}"}
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(req, timeout=5) as resp:
            if ALIAS in {m["id"] for m in json.loads(resp.read())["data"]}:
                return
        time.sleep(0.1)
    raise SystemExit(f"the proxy never listed {ALIAS}")


def one_rep(port: int, key: str, deployment_id: int) -> dict[str, float]:
    from nodes.agent import runtime
    from nodes.choices import DesiredState
    from nodes.models import Deployment

    out: dict[str, float] = {}
    began = time.perf_counter()
    assert chat(port, key) == 200
    out["awake_s"] = time.perf_counter() - began

    assert runtime.sleep(deployment_id, 1) == "asleep"
    time.sleep(1.0)  # the proxy's snapshot follows the config change
    began = time.perf_counter()
    status = chat(port, key)
    out["wake_s"] = time.perf_counter() - began
    assert status == 200, status

    Deployment.objects.filter(pk=deployment_id).update(desired_state=DesiredState.STOPPED)
    assert runtime.stop(deployment_id) == "stopped"
    Deployment.objects.filter(pk=deployment_id).update(desired_state=DesiredState.RUNNING)
    time.sleep(1.0)
    began = time.perf_counter()
    runtime.launch(deployment_id)
    while chat(port, key) != 200:
        time.sleep(0.05)
    out["cold_s"] = time.perf_counter() - began
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    options = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="sleep-wake-bench-"))
    env = configure(tmp)
    sys.path.insert(0, str(REPO))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from console.models import Tenant
    from console.services import issue_api_key
    from nodes.agent import runtime
    from nodes.choices import DeploymentState
    from vllm_sim.profiles import PROFILES, derive_engine_shape, wake_time_s

    key = issue_api_key(tenant=Tenant.objects.create(name="bench"), name="bench").raw_key
    supervisor, deployment_id = make_engine(tmp)
    runtime.launch(deployment_id)
    loop = threading.Thread(target=supervisor.run, daemon=True)
    loop.start()
    proxy, port = start_proxy(env, tmp)
    reps: list[dict[str, float]] = []
    try:
        wait_state(deployment_id, DeploymentState.READY)
        wait_listed(port, key)
        chat(port, key)  # warm the proxy's connections
        for n in range(options.reps):
            reps.append(one_rep(port, key, deployment_id))
            print(f"rep {n + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in reps[-1].items()), flush=True)
    finally:
        supervisor.close()
        proxy.terminate()
        proxy.wait(10)
        from core.redis_client import get_redis
        from nodes import process
        from nodes.models import Deployment

        for deployment in Deployment.objects.filter(pid__isnull=False):
            process.stop_engine(deployment.pid, timeout=5)  # type: ignore[arg-type]
        redis = get_redis()
        for redis_key in redis.scan_iter(match=f"{env['REDIS_KEY_PREFIX']}*", count=500):
            redis.delete(redis_key)
    median = {k: statistics.median(r[k] for r in reps) for k in reps[0]}
    shape = derive_engine_shape(PROFILES["h100-llama3-8b-fp16"], max_model_len=8192)
    result = {
        "reps": len(reps),
        "telemetry_tick_s": 1.0,
        "wake_poll_s": 0.1,
        "modelled_level1_wake_s": round(wake_time_s(shape, 1, frozenset({"weights", "kv_cache"})), 3),
        "median_awake_s": round(median["awake_s"], 3),
        "median_wake_s": round(median["wake_s"], 3),
        "median_cold_s": round(median["cold_s"], 3),
        "extra_wake_s": round(median["wake_s"] - median["awake_s"], 3),
        "extra_cold_s": round(median["cold_s"] - median["awake_s"], 3),
        "cold_over_wake": round(
            (median["cold_s"] - median["awake_s"]) / (median["wake_s"] - median["awake_s"]), 2
        ),
        "all": reps,
    }
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    (BENCH_DIR / "sleep_wake.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "all"}, indent=2))


if __name__ == "__main__":
    main()
