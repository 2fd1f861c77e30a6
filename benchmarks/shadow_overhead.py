"""Shadow mirroring's cost to the primary: the client's p50 with 10% of requests mirrored, against none.

One command (a scratch test database on DATABASE_URL's server is created and dropped):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python benchmarks/shadow_overhead.py

The path real users take: a standalone proxy (`python -m routing.proxy`, one worker) with its request
log on PostgreSQL, a tenant with a quota (so every request is admitted by the limiter in Redis) that
consents to mirroring, a real API key; two simulator deployments of one alias, the active version and
the shadow candidate (time scale --time-scale). One client sends --requests sequential chat requests
(16 output tokens, greedy, 50 different prompts in turn) per repetition over one keep-alive
connection and the repetition's p50 is taken; repetitions alternate mirroring off and on (the
ShadowConfig's `enabled`, saved, which the proxy hears over pub/sub), --reps of each, and the medians
of the p50s are compared. The mirrors of each repetition are counted from the stored ShadowPairs.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inferchain.settings")
os.environ.setdefault("REDIS_KEY_PREFIX", f"benchshadow{os.getpid()}:")

import django  # noqa: E402 - after the environment it reads

django.setup()

from django.conf import settings  # noqa: E402
from django.test.utils import setup_databases, teardown_databases  # noqa: E402

from console.models import Quota, Tenant  # noqa: E402
from console.services import issue_api_key  # noqa: E402
from core.redis_client import get_redis  # noqa: E402
from models_registry.models import Model, ModelAlias, ModelVersion  # noqa: E402
from nodes.lifecycle import engine_api_key  # noqa: E402
from nodes.models import Deployment, Host  # noqa: E402
from routing.models import ShadowConfig, ShadowPair  # noqa: E402
from vllm_sim.testing import SimHandle, free_port, start_sim  # noqa: E402

SIM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ALIAS = "bench-shadow"


def sim_deployment(host: Host, version: ModelVersion, time_scale: float) -> tuple[Deployment, SimHandle]:
    port = free_port()
    dep = Deployment.objects.create(
        name=f"{ALIAS}-{port}",
        model_version=version,
        host=host,
        port=port,
        served_model_name=ALIAS,
        max_model_len=4096,
        state="ready",
        start_token=secrets.token_hex(8),
        engine="sim",
    )
    sim = start_sim(
        SIM_MODEL,
        "--served-model-name",
        ALIAS,
        "--max-model-len",
        "4096",
        port=port,
        api_key=engine_api_key(dep),
        time_scale=time_scale,
    )
    return dep, sim


def start_proxy(logs: Path) -> tuple[subprocess.Popen[bytes], int]:
    db = settings.DATABASES["default"]
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_KEY_PREFIX": settings.REDIS_KEY_PREFIX,
        "REQUEST_LOG_SPOOL_DIR": tempfile.mkdtemp(prefix="spool-"),
    }
    log = (logs / "proxy.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "routing.proxy", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as resp:
                if resp.status == 200:
                    return proc, port
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"proxy not ready: {(logs / 'proxy.log').read_text()[-2000:]}")


def run_rep(port: int, key: str, requests: int) -> list[float]:
    """Latencies (ms) of `requests` sequential chat requests over one keep-alive connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    out = []
    for n in range(requests):
        body = json.dumps(
            {
                "model": ALIAS,
                "messages": [{"role": "user", "content": f"Tell me about topic number {n % 50}."}],
                "max_tokens": 16,
                "temperature": 0,
            }
        )
        t0 = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body, headers)
        resp = conn.getresponse()
        resp.read()
        out.append((time.perf_counter() - t0) * 1000)
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}")
    conn.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=400, help="requests per repetition")
    parser.add_argument("--reps", type=int, default=5, help="repetitions of each mode (alternating)")
    parser.add_argument("--percent", type=float, default=10.0)
    parser.add_argument("--time-scale", type=float, default=50.0)
    args = parser.parse_args()

    old_config = setup_databases(verbosity=0, interactive=False)
    sims: list[SimHandle] = []
    proxy: subprocess.Popen[bytes] | None = None
    logs = Path(tempfile.mkdtemp(prefix="shadow-bench-"))
    try:
        model = Model.objects.create(name="llama-3.1-8b")
        v1, v2 = (
            ModelVersion.objects.create(
                model=model, revision=rev, source_kind="directory", source_path=f"/models/{rev}"
            )
            for rev in ("main", "candidate")
        )
        alias = ModelAlias.objects.create(name=ALIAS, active_version=v1)
        host = Host.objects.create(name="bench-host", address="127.0.0.1")
        for version in (v1, v2):
            sims.append(sim_deployment(host, version, args.time_scale)[1])
        tenant = Tenant.objects.create(name="bench", shadow_consent=True)
        Quota.objects.create(
            tenant=tenant,
            requests_per_minute=1_000_000,
            tokens_per_minute=1_000_000_000,
            daily_token_budget=1_000_000_000_000,
        )
        key = issue_api_key(tenant=tenant, name="bench").raw_key
        config = ShadowConfig.objects.create(
            alias=alias, candidate_version=v2, percent=args.percent, enabled=False
        )
        proxy, port = start_proxy(logs)
        run_rep(port, key, 100)  # warm up: connections, tokenizer, key cache

        p50: dict[str, list[float]] = {"off": [], "on": []}
        p90: dict[str, list[float]] = {"off": [], "on": []}
        mirrored: list[int] = []
        for rep in range(2 * args.reps):
            mode = ("off", "on")[rep % 2]
            config.enabled = mode == "on"
            config.save()  # published to the proxy (routing.signals)
            time.sleep(1.0)
            before = ShadowPair.objects.count()
            latencies = run_rep(port, key, args.requests)
            p50[mode].append(statistics.median(latencies))
            p90[mode].append(statistics.quantiles(latencies, n=10)[-1])
            if mode == "on":
                time.sleep(1.0)  # the pair writer flushes every half second
                mirrored.append(ShadowPair.objects.count() - before)
            print(
                f"rep {rep + 1}: mirroring {mode}: p50 {p50[mode][-1]:.2f} ms, p90 {p90[mode][-1]:.2f} ms",
                flush=True,
            )

        print()
        print(
            f"| mirroring ({args.requests} sequential requests per rep, {args.reps} reps each, alternating) "
            "| p50 ms (median of reps) | p90 ms (median of reps) | p50 of each rep |"
        )
        print("|---|---:|---:|---|")
        for mode, label in (("off", "off"), ("on", f"{args.percent:g}% of requests")):
            reps = ", ".join(f"{v:.2f}" for v in p50[mode])
            mid50, mid90 = statistics.median(p50[mode]), statistics.median(p90[mode])
            print(f"| {label} | {mid50:.2f} | {mid90:.2f} | {reps} |")
        delta = statistics.median(p50["on"]) - statistics.median(p50["off"])
        spread = statistics.pstdev(p50["off"])
        print(f"\np50 difference (on - off): {delta:+.2f} ms; sd of the p50s, mirroring off: {spread:.2f} ms")
        total = args.requests * args.reps
        share = 100 * sum(mirrored) / total
        print(f"mirrored: {sum(mirrored)} of {total} requests ({share:.1f}%), per rep {mirrored}")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            counters = [
                line
                for line in resp.read().decode().splitlines()
                if line.startswith(
                    ("inferchain_proxy_shadow_mirrors_total", "inferchain_proxy_shadow_skipped_total")
                )
            ]
        print("proxy counters:", "; ".join(counters) or "none")
    finally:
        if proxy is not None:
            proxy.terminate()
            proxy.wait(10)
        for sim in sims:
            sim.stop()
        teardown_databases(old_config, verbosity=0)
        r = get_redis()
        for k in r.scan_iter(match=f"{settings.REDIS_KEY_PREFIX}*", count=500):
            r.delete(k)


if __name__ == "__main__":
    main()
