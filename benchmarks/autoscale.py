"""Autoscaling on the simulator: a step from 1 to --clients concurrent clients on a pool of one engine.

One command (a scratch test database on DATABASE_URL's server is created and dropped):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python benchmarks/autoscale.py

The parts real installs run, in one process except the proxy and the engines: a standalone proxy
(`python -m routing.proxy`), simulator engines (`--sim-time-scale --time-scale`, `--max-num-seqs
--max-num-seqs` so one engine saturates and requests wait), the node agent's supervisor (probes and the
live records the scaler reads, every 0.25 s) plus what its Celery worker does with the scaler's queued
launches and drains (runtime.launch / runtime.stop with drain, called here on the same rows), and the
beat task's body (routing.scaling.autoscaler.evaluate_due, every second; the policy's interval is 2 s).

Load: closed-loop clients streaming chat completions through the proxy (--max-tokens output tokens,
`ignore_eos`). One client for --warmup seconds, then --clients for --step seconds, then none until
the pool is back at its minimum (or --idle-timeout). Printed: the time from the step to the first
scale-up decision, to the last one, and to the moment the pool serves with its final engine count;
goodput (requests per second that finished with TTFT <= --slo-ttft and no error) from the step until
the added engines serve (one engine) and over the last --window seconds of the step (at the target);
the time from the end of the load to the pool back at one engine; and every failed request (there
should be none).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inferchain.settings")
os.environ.setdefault("REDIS_KEY_PREFIX", f"benchscale{os.getpid()}:")

import django  # noqa: E402 - after the environment it reads

django.setup()

import aiohttp  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import setup_databases, teardown_databases  # noqa: E402
from django.utils import timezone  # noqa: E402

from console.models import Quota, Tenant  # noqa: E402
from console.services import issue_api_key  # noqa: E402
from core.redis_client import get_redis  # noqa: E402
from models_registry.models import Model, ModelAlias  # noqa: E402
from models_registry.services import register_version  # noqa: E402
from nodes import process  # noqa: E402
from nodes.agent import runtime  # noqa: E402
from nodes.agent.gpus import GpuSource, simulated_gpu_config  # noqa: E402
from nodes.agent.services import report_gpus  # noqa: E402
from nodes.agent.supervisor import Supervisor  # noqa: E402
from nodes.choices import DeploymentState, DesiredState, Engine, HostState  # noqa: E402
from nodes.demo import LLAMA_31_8B_CONFIG, write_config_dir  # noqa: E402
from nodes.models import Deployment, Host  # noqa: E402
from routing.models import RoutePool  # noqa: E402
from routing.scaling import autoscaler  # noqa: E402
from routing.scaling.models import ScalingDecision, ScalingPolicy  # noqa: E402
from vllm_sim.testing import free_port  # noqa: E402

ALIAS = "bench-scale"
ROLE = "bench"
PROFILE = "h100-llama3-8b-fp16"


@dataclass
class Result:
    start: float
    end: float
    ttft: float | None
    ok: bool
    error: str = ""


class Load:
    """Closed-loop streaming clients in their own event loop; `clients` can change while it runs."""

    def __init__(self, url: str, key: str, max_tokens: int) -> None:
        self.url, self.key, self.max_tokens = url, key, max_tokens
        self.clients = 0
        self.results: list[Result] = []
        self.done = False
        self.thread = threading.Thread(target=lambda: asyncio.run(self.main()), daemon=True)
        self.thread.start()

    async def one(self, session: aiohttp.ClientSession, n: int) -> None:
        body = {
            "model": ALIAS,
            "messages": [{"role": "user", "content": f"request {n}: tell a story about the sea"}],
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
        start = time.monotonic()
        ttft = None
        try:
            async with session.post(
                self.url, json=body, headers={"Authorization": f"Bearer {self.key}"}
            ) as resp:
                if resp.status != 200:
                    text = (await resp.text())[:200]
                    self.results.append(Result(start, time.monotonic(), None, False, f"{resp.status} {text}"))
                    return
                async for line in resp.content:
                    if ttft is None and line.startswith(b"data: {") and b'"content"' in line:
                        ttft = time.monotonic() - start
                    if b'"error"' in line:
                        self.results.append(Result(start, time.monotonic(), ttft, False, line.decode()[:200]))
                        return
            self.results.append(Result(start, time.monotonic(), ttft, True))
        except Exception as exc:  # counted, printed at the end
            self.results.append(Result(start, time.monotonic(), ttft, False, repr(exc)[:200]))

    async def client(self, session: aiohttp.ClientSession, index: int) -> None:
        n = 0
        while not self.done:
            if index >= self.clients:
                await asyncio.sleep(0.05)
                continue
            n += 1
            await self.one(session, index * 100_000 + n)

    async def main(self) -> None:
        timeout = aiohttp.ClientTimeout(total=300)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            await asyncio.gather(*(self.client(session, i) for i in range(200)))


class Agent:
    """The node agent: the supervisor's rounds, and the launches and drains its worker would run."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.supervisor = Supervisor(host.name, GpuSource(host.name, simulated_gpu_config(PROFILE, 8)))
        self.supervisor.start()
        self.started: set[int] = set()
        self.stopping: set[int] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def _in_thread(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        def call() -> None:
            try:
                fn(*args, **kwargs)
            finally:
                connection.close()

        threading.Thread(target=call, daemon=True).start()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.supervisor.tick()
                for dep in Deployment.objects.filter(host=self.host):
                    if dep.desired_state == DesiredState.RUNNING and dep.pk not in self.started:
                        self.started.add(dep.pk)
                        if dep.state == DeploymentState.PENDING:
                            self._in_thread(runtime.launch, dep.pk)
                    if dep.desired_state == DesiredState.STOPPED and dep.pk not in self.stopping:
                        self.stopping.add(dep.pk)
                        self._in_thread(runtime.stop, dep.pk, drain=True)
            except Exception as exc:
                print("agent round failed:", exc, flush=True)
            time.sleep(0.25)
        connection.close()


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


def goodput(results: list[Result], t0: float, t1: float, slo: float) -> tuple[float, int, int]:
    done = [r for r in results if t0 <= r.end < t1]
    good = [r for r in done if r.ok and r.ttft is not None and r.ttft <= slo]
    return len(good) / (t1 - t0), len(good), len(done)


def serving(policy: ScalingPolicy) -> int:
    return autoscaler.engine_counts(policy)["serving"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--step", type=float, default=60.0, help="seconds of --clients")
    parser.add_argument("--window", type=float, default=20.0, help="goodput window at the end of the step")
    parser.add_argument("--idle-timeout", type=float, default=240.0)
    parser.add_argument("--max-engines", type=int, default=8)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--slo-ttft", type=float, default=1.0)
    parser.add_argument("--scale-up-cooldown", type=int, default=5)
    parser.add_argument("--scale-down-cooldown", type=int, default=15)
    parser.add_argument("--out", type=Path, default=REPO / "var" / "benchmarks" / "autoscale.json")
    args = parser.parse_args()

    old_config = setup_databases(verbosity=0, interactive=False)
    logs = Path(tempfile.mkdtemp(prefix="autoscale-bench-"))
    settings.ENGINE_LOG_DIR = logs / "engines"
    settings.MODEL_ROOTS = [logs / "models"]
    (logs / "models").mkdir()
    proxy: subprocess.Popen[bytes] | None = None
    agent: Agent | None = None
    load: Load | None = None
    try:
        host = Host.objects.create(
            name="bench-gpu",
            address="127.0.0.1",
            role=ROLE,
            state=HostState.ONLINE,
            last_heartbeat=timezone.now(),
        )
        report_gpus(host, GpuSource(host.name, simulated_gpu_config(PROFILE, 8)).inventory())
        model = Model.objects.create(name="Llama-3.1-8B-Instruct")
        directory = write_config_dir(logs / "models" / "llama", LLAMA_31_8B_CONFIG)
        version = register_version(
            model=model, revision="fp16", source_path=str(directory), host_name=host.name
        )
        ModelAlias.objects.create(name=ALIAS, active_version=version)
        template = Deployment.objects.create(
            name="scale-1",
            model_version=version,
            engine=Engine.SIM,
            host=host,
            gpu_indices=[0],
            gpu_memory_utilization=0.45,
            max_model_len=4096,
            max_num_seqs=args.max_num_seqs,
            port=free_port(),
            served_model_name=ALIAS,
            role=ROLE,
            extra_args=["--sim-time-scale", str(args.time_scale)],
        )
        pool = RoutePool.objects.create(name=ALIAS, alias=ALIAS, role=ROLE, max_inflight_per_endpoint=256)
        agent = Agent(host)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            template.refresh_from_db()
            if template.state == DeploymentState.READY:
                break
            time.sleep(0.2)
        assert template.state == DeploymentState.READY, template.state_reason
        policy = ScalingPolicy.objects.create(
            pool=pool,
            template=template,
            min_engines=1,
            max_engines=args.max_engines,
            target_waiting_per_engine=2.0,
            target_kv_usage=0.8,
            scale_up_cooldown_s=args.scale_up_cooldown,
            scale_down_cooldown_s=args.scale_down_cooldown,
            evaluation_interval_s=2,
        )
        tenant = Tenant.objects.create(name="bench")
        Quota.objects.create(
            tenant=tenant,
            requests_per_minute=1_000_000,
            tokens_per_minute=1_000_000_000,
            daily_token_budget=1_000_000_000_000,
        )
        key = issue_api_key(tenant=tenant, name="bench").raw_key
        proxy, port = start_proxy(logs)
        load = Load(f"http://127.0.0.1:{port}/v1/chat/completions", key, args.max_tokens)

        timeline: list[dict[str, Any]] = []

        def sample() -> None:
            policy.refresh_from_db()
            counts = autoscaler.engine_counts(policy)
            timeline.append(
                {
                    "t": round(time.monotonic() - t_step, 2),
                    "clients": load.clients if load else 0,
                    **counts,
                    "target": policy.last_target_engines,
                    "waiting_per_engine": policy.last_metrics.get("waiting_per_engine"),
                }
            )

        def run_for(seconds: float) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                autoscaler.evaluate_due()
                sample()
                time.sleep(1.0)

        load.clients = 1
        t_step = time.monotonic()
        run_for(args.warmup)
        load.clients = args.clients
        t_step = time.monotonic()
        wall_step = timezone.now()
        timeline.clear()
        run_for(args.step)
        t_step_end = time.monotonic()
        load.clients = 0
        t_idle = time.monotonic()
        while time.monotonic() - t_idle < args.idle_timeout:
            autoscaler.evaluate_due()
            sample()
            if (
                serving(policy) == 1
                and not Deployment.objects.filter(state=DeploymentState.STOPPING).exists()
            ):
                break
            time.sleep(1.0)
        t_down = time.monotonic() - t_idle
        load.done = True

        decisions = list(policy.decisions.order_by("at"))
        ups = [d for d in decisions if d.action == ScalingDecision.Action.SCALE_UP]
        downs = [d for d in decisions if d.action == ScalingDecision.Action.SCALE_DOWN]
        final = max((row["serving"] for row in timeline if row["t"] <= args.step), default=1)
        reached = next((row["t"] for row in timeline if row["serving"] >= final), None)

        def since_step(d: ScalingDecision) -> float:
            return round((d.at - wall_step).total_seconds(), 1)

        # Until the added engines serve, the step runs on the template alone.
        more = next((row["t"] for row in timeline if row["serving"] > 1), args.step)
        one_engine = goodput(load.results, t_step, t_step + max(more, 0.5), args.slo_ttft)
        at_target = goodput(load.results, t_step_end - args.window, t_step_end, args.slo_ttft)
        failures = [r.error for r in load.results if not r.ok]
        report = {
            "clients": args.clients,
            "max_num_seqs": args.max_num_seqs,
            "max_tokens": args.max_tokens,
            "time_scale": args.time_scale,
            "slo_ttft_s": args.slo_ttft,
            "first_scale_up_s": since_step(ups[0]) if ups else None,
            "last_scale_up_s": since_step(ups[-1]) if ups else None,
            "scale_ups": [(d.engines_before, d.engines_after) for d in ups],
            "target_engines": final,
            "serving_at_target_s": reached,
            "goodput_one_engine_rps": round(one_engine[0], 2),
            "goodput_one_engine_counts": one_engine[1:],
            "goodput_at_target_rps": round(at_target[0], 2),
            "goodput_at_target_counts": at_target[1:],
            "scale_downs": len(downs),
            "idle_back_to_one_s": round(t_down, 1),
            "requests": len(load.results),
            "failed": len(failures),
            "failures": failures[:10],
            "timeline": timeline,
            "decisions": [
                {
                    "at": d.at.isoformat(),
                    "action": d.action,
                    "reason": d.reason,
                    "engines": [d.engines_before, d.engines_after],
                }
                for d in decisions
            ],
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
        print(
            f"step 1 -> {args.clients} clients, max_num_seqs {args.max_num_seqs}, "
            f"{args.max_tokens} output tokens, "
            f"time scale {args.time_scale:g}, goodput SLO TTFT <= {args.slo_ttft:g} s"
        )
        print("| figure | value |")
        print("|---|---:|")
        print(f"| first scale-up decision after the step | {report['first_scale_up_s']} s |")
        print(
            "| scale-ups (engines before -> after) | "
            f"{', '.join(f'{a}->{b}' for a, b in report['scale_ups'])} |"
        )
        print(f"| last scale-up decision after the step | {report['last_scale_up_s']} s |")
        print(f"| target engine count / serving with it after | {final} / {reached} s |")
        print(
            f"| goodput until the added engines serve ({more:g} s, 1 engine) | "
            f"{report['goodput_one_engine_rps']} req/s "
            f"({one_engine[1]} of {one_engine[2]} within the SLO) |"
        )
        print(
            f"| goodput, last {args.window:g} s of the step ({final} engines) | "
            f"{report['goodput_at_target_rps']} req/s "
            f"({at_target[1]} of {at_target[2]} within the SLO) |"
        )
        print(
            f"| idle: back to 1 engine after the load ended | {report['idle_back_to_one_s']} s "
            f"({len(downs)} scale-downs) |"
        )
        print(f"| requests / failed | {len(load.results)} / {len(failures)} |")
        for failure in failures[:10]:
            print("failure:", failure)
        print(f"(JSON with the timeline and every decision: {args.out})")
    finally:
        if load is not None:
            load.done = True
        if agent is not None:
            agent.stop.set()
            agent.thread.join(10)
            agent.supervisor.close()
        for dep in Deployment.objects.exclude(pid=None):
            if dep.pid and process.is_alive(dep.pid):
                process.stop_engine(dep.pid, 5.0)
        if proxy is not None:
            proxy.terminate()
            proxy.wait(10)
        for key in get_redis().scan_iter(match=f"{settings.REDIS_KEY_PREFIX}*", count=500):
            get_redis().delete(key)
        teardown_databases(old_config, verbosity=0)


if __name__ == "__main__":
    main()
