"""What the route decision buys: routing policies compared on simulated fleets, one command per scenario.

    .venv/bin/python benchmarks/routing_scenarios.py heterogeneous|prefix|homogeneous|mixed
        [--quick] [--reps 3] [--time-scale 2] [--policies a,b] [--skip-litellm] [--plot docs/x]

Each scenario starts its simulator engines (vllm_sim, fixed profiles, `--time-scale` times faster than
the modelled hardware), a scratch PostgreSQL database holding them as ready deployments, and, for every
policy in turn, a fresh inferchain proxy (`python -m routing.proxy`) configured with that policy, or a
LiteLLM proxy (its own virtualenv, pinned, configured as benchmarks/proxy_overhead.py does) with one of
its routing strategies over the same engines. The load is `inferchain bench`'s runner (bench/):
closed loop at the scenario's client counts, the same seeded workload for every policy, streamed, timed
by token arrival. Between runs every engine's prefix cache is reset, so no policy inherits another's
cache. The policies run interleaved (rep 1 of every policy, then rep 2, ...) and the tables report the
median over reps, so a change in this shared machine's load hits every policy alike.

Times are the modelled hardware's: wall-clock times are multiplied by the time scale (throughputs
divided by it), so a number reads as it would on the GPUs the profiles model. Goodput counts the
requests meeting the SLO (TTFT and time per output token, modelled time) per second.

Scenarios (docs/benchmarks.md has the tables and what they mean):

- heterogeneous: one long-context engine (A100-80G x4, Llama-3.1-70B bf16, 32k context) and two
  high-throughput engines (A10-24G, Llama-3.1-8B AWQ int4, 8k context); 80% short prompts (~300
  tokens), 20% long (~6,500 tokens). `chain` is the demo's policy (routing/demo.py): prompts up to
  4,000 tokens to the fast pool, spilling onto the long pool while it has headroom; the rest to the
  long pool. `chain_nospill` is the same without the spill.
- prefix: four identical A10 engines; 48 tenants, each with its own ~3,000-token system prompt (their
  sum exceeds one engine's KV cache, not four), in multi-turn sessions (X-Session-Id).
- homogeneous: four identical A10 engines, short prompts with nothing shared: the control.
- mixed: the predicted scorers' scenario. One A100-80G x4 engine (Llama-3.1-70B) and three A10s
  (Llama-3.1-8B int4) on one host with a cost per GPU-hour (the 70B engine holds four GPUs, so costs
  four A10 engines); a mixed workload: short chats with small and large `max_tokens`, long documents,
  prompts behind eight shared system prompts. Every level first sends `warmup_requests` unmeasured
  requests (the predictors need MIN_SAMPLES answers per engine before they are used). Adds the cost per
  1,000 output tokens, two ways: the fleet held for the level's duration ("held") and each engine's
  busy time only ("busy", the bill of a fleet that releases idle engines), and each engine's
  predictor error (MAPE, from the proxy's published report).

`--quick` runs a tiny version (a few requests, one level, one rep, inferchain policies only) in seconds:
the test that keeps this harness from rotting (tests/routing/test_routing_scenarios.py).
Results: Markdown on stdout, JSON with every rep in var/bench/routing_<scenario>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from proxy_overhead import (  # noqa: E402
    LITELLM_VERSION,
    bench_database,
    ensure_litellm,
    free_port,
    spawn,
    stop,
    wait_ready,
)

from bench.runner import Level, Plan, Report, run  # noqa: E402
from bench.stats import Slo  # noqa: E402
from bench.workload import SyntheticMix, WorkItem, synthetic  # noqa: E402
from vllm_sim.testing import SimHandle, start_sim  # noqa: E402

BENCH_DIR = REPO / "var" / "bench"
ALIAS = "bench"
CHAIN_MAX_SHORT_TOKENS = 4000
PREFIX_WARMUP = 144
# Fixed seeds: the workloads' (17), the load client's (the rep), the `random` scorer's and LiteLLM's
# `simple-shuffle`'s (SEED + rep, SEED).
SEED = 17
REDIS_PREFIX = f"routebench{os.getpid()}:"
# The demo's spill (routing/demo.py DEMO_SPILL), restated so a change there shows in this file's diff.
CHAIN_SPILL: dict[str, int | float] = {"max_inflight": 6, "max_kv_used": 0.5, "min_home_inflight": 1}
INFERCHAIN_SCORERS = (
    "round_robin",
    "random",
    "least_outstanding",
    "best_fit",
    "prefix_affinity",
    "session_affinity",
)
# The scorers that predict (routing/proxy/predict.py), compared with today's in the mixed scenario.
PREDICTED_SCORERS = ("predicted_latency", "slo_cost")
TODAYS_IN_MIXED = ("round_robin", "least_outstanding", "best_fit", "prefix_affinity")
LITELLM_STRATEGIES = ("simple-shuffle", "least-busy", "latency-based-routing")


@dataclass(frozen=True)
class Node:
    role: str
    profile: str
    model: str
    max_model_len: int
    tp: int = 1


@dataclass
class Scenario:
    name: str
    nodes: tuple[Node, ...]
    items: list[WorkItem]
    levels: tuple[int, ...]
    requests_per_level: int
    slo_ttft_s: float = 2.0
    slo_itl_s: float = 0.1
    policies: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)
    # Requests sent before each level's measurement, on the same (reset) caches and through the same
    # policy, and left out of its figures: a production service runs warm (prefix scenario).
    warmup_requests: int = 0
    # The host's cost per GPU-hour (0: no costs); an engine costs its tensor-parallel GPUs' worth.
    cost_per_gpu_hour: float = 0.0


A10 = Node(
    "high-throughput", "a10-llama3-8b-int4", "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4", 8192
)
A100_70B = Node("long-context", "a100-llama3-70b-fp16", "meta-llama/Llama-3.1-70B-Instruct", 32768, tp=4)


def _words(rng: random.Random, n: int) -> str:
    from bench.workload import _WORDS

    return " ".join(rng.choice(_WORDS) for _ in range(n))


def heterogeneous_items(n: int, seed: int) -> list[WorkItem]:
    mix = SyntheticMix(
        requests=n,
        prompt_tokens=300,
        output_tokens=96,
        long_share=0.2,
        long_prompt_tokens=6500,
        sigma=0.15,
        seed=seed,
    )
    return synthetic(mix)


def prefix_items(n: int, seed: int, tenants: int = 48, prefix_words: int = 3000) -> list[WorkItem]:
    """Multi-turn sessions of many tenants, each tenant with its own long system prompt.

    Sessions of 1-4 turns; each turn repeats the conversation so far (system prompt, earlier turns and
    canned assistant answers) plus a new ~80-word question. The sessions are interleaved (turn k of a
    session comes about a round of sessions after turn k-1) so a closed loop sends a session's turns in
    order, rarely at once."""
    rng = random.Random(seed)
    systems = [_words(random.Random(seed * 7919 + t), prefix_words) for t in range(tenants)]
    sessions: list[list[WorkItem]] = []
    count = 0
    s = 0
    while count < n:
        tenant = rng.randrange(tenants)
        turns = rng.randint(1, 4)
        messages: list[dict[str, Any]] = [{"role": "system", "content": systems[tenant]}]
        mine: list[WorkItem] = []
        for _ in range(turns):
            messages = [*messages, {"role": "user", "content": _words(rng, 80)}]
            mine.append(
                WorkItem(
                    max_tokens=max(8, int(rng.lognormvariate(4.1, 0.3))),
                    messages=list(messages),
                    prefix_group=str(tenant),
                    session_id=f"s{s}",
                )
            )
            messages = [*messages, {"role": "assistant", "content": _words(rng, 60)}]
        sessions.append(mine)
        count += turns
        s += 1
    out: list[WorkItem] = []
    depth = 0
    while len(out) < n:
        for sess in sessions:
            if depth < len(sess) and len(out) < n:
                out.append(sess[depth])
        depth += 1
    return out


def homogeneous_items(n: int, seed: int) -> list[WorkItem]:
    return synthetic(SyntheticMix(requests=n, prompt_tokens=300, output_tokens=96, sigma=0.4, seed=seed))


def mixed_items(n: int, seed: int) -> list[WorkItem]:
    """Short chats (55 %: ~250 tokens, max_tokens 32 to 512), long documents (15 %: ~6,000 tokens,
    max_tokens 64 or 256) and requests behind one of eight ~1,500-token system prompts (30 %, max_tokens
    64 or 256): the mixed workload of the predicted scorers' scenario."""
    rng = random.Random(seed)
    systems = [_words(random.Random(seed * 7919 + g), 1500) for g in range(8)]
    items: list[WorkItem] = []
    for i in range(n):
        draw = rng.random()
        if draw < 0.55:
            words = max(20, int(rng.lognormvariate(math.log(250), 0.4)))
            messages = [{"role": "user", "content": f"Request {i}: " + _words(rng, words)}]
            items.append(WorkItem(max_tokens=rng.choice([32, 64, 128, 512]), messages=messages))
        elif draw < 0.70:
            words = max(1000, int(rng.lognormvariate(math.log(6000), 0.15)))
            messages = [{"role": "user", "content": f"Document {i}: " + _words(rng, words)}]
            items.append(WorkItem(max_tokens=rng.choice([64, 256]), messages=messages))
        else:
            group = rng.randrange(len(systems))
            messages = [
                {"role": "system", "content": systems[group]},
                {"role": "user", "content": f"Question {i}: " + _words(rng, 60)},
            ]
            items.append(
                WorkItem(max_tokens=rng.choice([64, 256]), messages=messages, prefix_group=str(group))
            )
    return items


def build_scenario(name: str, quick: bool, requests: int = 0) -> Scenario:
    """The scenario; `requests` per level overrides its default (the workload grows to match)."""
    n = requests or (12 if quick else 160)
    levels: tuple[int, ...]
    if name == "heterogeneous":
        levels = (4,) if quick else (8, 16, 32)
        return Scenario(
            name,
            (A100_70B, A10, A10),
            heterogeneous_items(len(levels) * (requests or 120) + 8, seed=17),
            levels,
            requests or (n if quick else 120),
            policies=(*INFERCHAIN_SCORERS, "chain_nospill", "chain"),
        )
    if name == "prefix":
        levels = (4,) if quick else (16,)
        # Warm: each level first sends PREFIX_WARMUP requests of the same stream (3 per tenant), unmeasured,
        # so the measured requests see the caches each policy leaves in steady state, as a production
        # service would; the rare tenant still unseen after them is counted (cold_first_visits).
        warm = 8 if quick else PREFIX_WARMUP
        n = requests or (12 if quick else 384)
        return Scenario(
            name,
            (A10, A10, A10, A10),
            prefix_items(
                max(n + warm + 8, 240),
                seed=17,
                tenants=4 if quick else 48,
                prefix_words=300 if quick else 3000,
            ),
            levels,
            n,
            policies=INFERCHAIN_SCORERS,
            notes=["chain: not applicable (one kind of engine: its rules would send everything to one pool)"],
            warmup_requests=warm,
        )
    if name == "homogeneous":
        levels = (4,) if quick else (16,)
        return Scenario(
            name,
            (A10, A10, A10, A10),
            homogeneous_items(max(n + 8, 200), seed=17),
            levels,
            n,
            policies=INFERCHAIN_SCORERS,
            notes=["chain: not applicable (one kind of engine: its rules would send everything to one pool)"],
        )
    if name == "mixed":
        levels = (4,) if quick else (24,)
        warm = 8 if quick else 192
        n = requests or (12 if quick else 160)
        return Scenario(
            name,
            (A100_70B, A10, A10, A10),
            mixed_items(max(len(levels) * (n + warm) + 8, 200), seed=17),
            levels,
            n,
            policies=(*TODAYS_IN_MIXED, *PREDICTED_SCORERS),
            warmup_requests=warm,
            cost_per_gpu_hour=2.0,
            notes=[
                "host cost 2.00 per GPU-hour: the 70B engine (4 GPUs) 8.00/h, each A10 engine 2.00/h",
            ],
        )
    raise SystemExit(f"unknown scenario {name!r}: heterogeneous, prefix, homogeneous or mixed")


# ---- the fleet ---------------------------------------------------------------------------------------


def start_engines(scenario: Scenario, time_scale: float) -> list[SimHandle]:
    sims: list[SimHandle] = []
    try:
        for node in scenario.nodes:
            sims.append(
                start_sim(
                    node.model,
                    *("--served-model-name", ALIAS, "--max-model-len", str(node.max_model_len)),
                    *("--tensor-parallel-size", str(node.tp)),
                    # The prefix-cache hit in each answer's usage: the predictors learn from it.
                    "--enable-prompt-tokens-details",
                    profile=node.profile,
                    time_scale=time_scale,
                    timeout=60,
                )
            )
    except BaseException:
        for sim in sims:
            sim.stop()
        raise
    return sims


def setup_database(db_url: str, scenario: Scenario, sims: list[SimHandle]) -> str:
    """Migrate, register the engines as ready deployments, and issue a key; returns the raw key."""
    env = {**os.environ, "DATABASE_URL": db_url, "DJANGO_SETTINGS_MODULE": "inferchain.settings"}
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=REPO, env=env, check=True
    )
    os.environ["DATABASE_URL"] = db_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inferchain.settings")
    import django

    django.setup()
    from console.models import Tenant
    from console.services import issue_api_key
    from models_registry.models import Model, ModelAlias, ModelVersion
    from nodes.models import Deployment, Gpu, Host

    model, _ = Model.objects.get_or_create(name="bench-model")
    version, _ = ModelVersion.objects.get_or_create(
        model=model,
        revision="main",
        defaults={"source_kind": "directory", "source_path": "/models/bench", "max_context": 32768},
    )
    ModelAlias.objects.get_or_create(name=ALIAS, defaults={"active_version": version})
    host, _ = Host.objects.get_or_create(name="bench-host", defaults={"address": "127.0.0.1"})
    gpus = sum(node.tp for node in scenario.nodes)
    if scenario.cost_per_gpu_hour:
        # Each engine bears the share of the host's cost its GPUs are (routing.proxy.predict.host_share).
        host.cost_per_hour = scenario.cost_per_gpu_hour * gpus
        host.save(update_fields=["cost_per_hour"])
        for index in range(gpus):
            Gpu.objects.get_or_create(host=host, index=index, defaults={"simulated": True})
    first = 0
    for i, (node, sim) in enumerate(zip(scenario.nodes, sims, strict=True)):
        held, first = list(range(first, first + node.tp)), first + node.tp
        Deployment.objects.create(
            gpu_indices=held,
            name=f"bench-{i}",
            model_version=version,
            host=host,
            port=sim.port,
            served_model_name=ALIAS,
            max_model_len=node.max_model_len,
            role=node.role,
            state="ready",
            start_token=f"bench{i}",
            engine="sim",
            # The agent's supervisor probes the process it finds here (simhost.supervise).
            pid=sim.proc.pid,
        )
    tenant, _ = Tenant.objects.get_or_create(name="bench-routing")  # no quota: admission skips Redis
    return issue_api_key(tenant=tenant, name="bench").raw_key


def configure_policy(policy: str) -> None:
    """The pools and policy of `policy` (one of INFERCHAIN_SCORERS, chain, chain_nospill)."""
    from routing.models import RoutePolicy, RoutePool

    RoutePolicy.objects.all().delete()
    RoutePool.objects.all().delete()
    if policy in INFERCHAIN_SCORERS or policy in PREDICTED_SCORERS:
        RoutePool.objects.create(name=ALIAS, alias=ALIAS, scorer=policy)
        return
    fast = RoutePool.objects.create(
        name="fast", alias=ALIAS, role="high-throughput", scorer="least_outstanding"
    )
    long = RoutePool.objects.create(name="long", alias=ALIAS, role="long-context", scorer="best_fit")
    rule: dict[str, Any] = {"match": {"max_prompt_tokens": CHAIN_MAX_SHORT_TOKENS}, "pool": fast.name}
    if policy == "chain":
        rule["spill"] = {"pool": long.name, **CHAIN_SPILL}
    RoutePolicy.objects.create(name="chain", alias=ALIAS, rules=[rule], default_pool=long, fallback_pool=long)


@contextlib.contextmanager
def host_agent(db_url: str, scenario: Scenario, time_scale: float, logs: Path) -> Iterator[Any]:
    """The node agent's supervisor loop over the engines (benchmarks/simhost.py, the agent's own code
    in a process of its own), writing their live records (KV-cache use, queues) to Redis, where the
    proxy reads them as it reads a real fleet's. Its period is NODE_TELEMETRY_SECONDS' default (1 s)
    in modelled time, i.e. 1 / time scale seconds of wall time, as the engines run that much faster."""
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "REDIS_KEY_PREFIX": REDIS_PREFIX,
        "NODE_TELEMETRY_SECONDS": f"{1.0 / time_scale:g}",
        "PYTHONPATH": str(REPO),
        "LOG_LEVEL": "WARNING",
    }
    gpus = sum(node.tp for node in scenario.nodes)
    proc = spawn(
        [
            sys.executable,
            str(REPO / "benchmarks" / "simhost.py"),
            "bench-host",
            scenario.nodes[0].profile,
            str(gpus),
        ],
        logs / "agent.log",
        env,
    )
    try:
        wait_live(scenario, proc)
        yield proc
    finally:
        stop(proc)


def wait_live(scenario: Scenario, proc: Any, timeout: float = 60.0) -> None:
    """Until the agent has written a live record with KV-cache state for every engine."""
    from core.redis_client import get_redis
    from nodes.models import Deployment

    r = get_redis()
    keys = [f"{REDIS_PREFIX}live:deployment:{pk}" for pk in Deployment.objects.values_list("pk", flat=True)]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the host agent exited with code {proc.returncode}")
        raws = r.mget(keys)
        if all(raw and json.loads(raw).get("kv_cache_total_tokens") for raw in raws):
            return
        time.sleep(0.2)
    raise RuntimeError(f"no live record with KV state for every engine after {timeout:.0f} s")


def route_reasons(since: Any) -> dict[str, int]:
    """How the proxy's scorers decided, from its request log (flushed when the proxy stops), numbers
    dropped and the pool named: e.g. {"fast: least_outstanding": 80, "long (spill): best_fit leftover":
    20}. A reason reads "<pool choice>[; spill ...]; <scorer's reason>"."""
    from routing.models import RequestLog

    counts: dict[str, int] = {}
    for reason in RequestLog.objects.filter(created_at__gte=since).values_list("route_reason", flat=True):
        parts = [p.strip() for p in (reason or "-").split(";")]
        pool = re.sub(r"=[^ ;]+", "", parts[0])
        spilled = any(p.startswith("spill") for p in parts[1:])
        # Numbers dropped, but an affinity scorer's rank kept as home (0) or moved (the load bound).
        why = re.sub(r"rank=0\b", "home", parts[-1])
        why = re.sub(r"rank=[1-9]\d*", "moved", why)
        key = f"{'spill' if spilled else pool}: {re.sub(r'=[^ ;]+', '', why)}"
        counts[key] = counts.get(key, 0) + 1
    return counts


@contextlib.contextmanager
def inferchain_proxy(
    db_url: str, logs: Path, seed: int, slo: tuple[float, float] | None = None
) -> Iterator[str]:
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "REDIS_KEY_PREFIX": REDIS_PREFIX,
        "REQUEST_LOG_SPOOL_DIR": str(logs / "spool"),
        "PROXY_RANDOM_SEED": str(seed),
    }
    if slo is not None:
        # The scenario's SLO in wall time (the proxy measures wall time): the standard class's targets,
        # which the bench key's requests get.
        env["PROXY_SLO_STANDARD"] = f"{slo[0]:g}/{slo[1]:g}"
        env["PROXY_DEFAULT_SLO_CLASS"] = "standard"
    forget_predictions()
    proc = spawn([sys.executable, "-m", "routing.proxy", "--port", str(port)], logs / "proxy.log", env)
    try:
        wait_ready(f"http://127.0.0.1:{port}/healthz", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def litellm_config(scenario: Scenario, sims: list[SimHandle], strategy: str) -> str:
    """LiteLLM over the same engines, as its production guide (docs/proxy/prod) and load-balancing
    docs configure it: one deployment per engine under one model name, `strategy` as the router's
    routing_strategy, each deployment's context window declared (`model_info.max_input_tokens`) with
    `enable_pre_call_checks` so that a prompt too long for an engine is not sent there (the inferchain
    proxy does the same from max_model_len); debug logging off, JSON logs, no spend or error logs
    (no database), no retries (the inferchain proxy retries only before the first byte, and no run
    here fails). One worker, as the inferchain proxy runs: with more, least-busy and latency-based
    routing would need Redis to share their counts (the guide's multi-instance advice)."""
    lines = ["model_list:"]
    for node, sim in zip(scenario.nodes, sims, strict=True):
        lines += [
            f"  - model_name: {ALIAS}",
            "    litellm_params:",
            f"      model: openai/{ALIAS}",
            f"      api_base: {sim.openai_base_url}",
            "      api_key: unused",
            "    model_info:",
            f"      max_input_tokens: {node.max_model_len}",
        ]
    lines += [
        "router_settings:",
        f"  routing_strategy: {strategy}",
        "  enable_pre_call_checks: true",
        "litellm_settings:",
        "  telemetry: false",
        "  set_verbose: false",
        "  json_logs: true",
        "  callbacks: []",
        "  num_retries: 0",
        "  request_timeout: 600",
        "general_settings:",
        "  disable_spend_logs: true",
        "  disable_error_logs: true",
    ]
    return "\n".join(lines) + "\n"


# LiteLLM's CLI with Python's shared generator seeded first (its simple-shuffle draws from it; its proxy
# runs in this one process with one worker).
LITELLM_SEEDED = (
    "import random, sys; random.seed(int(sys.argv.pop(1))); sys.argv[0] = 'litellm'; "
    "from litellm import run_server; sys.exit(run_server())"
)


def start_litellm(
    exe: Path, scenario: Scenario, sims: list[SimHandle], strategy: str, logs: Path
) -> tuple[Any, str, str]:
    import secrets

    port = free_port()
    cfg = logs / f"litellm-{strategy}.yaml"
    cfg.write_text(litellm_config(scenario, sims, strategy))
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["LITELLM_LOG"] = "ERROR"
    key = "sk-" + secrets.token_hex(16)
    env["LITELLM_MASTER_KEY"] = key
    python = exe.parent / "python"
    argv = [str(python), "-c", LITELLM_SEEDED, str(SEED), "--config", str(cfg), "--port", str(port)]
    proc = spawn(argv, logs / f"litellm-{strategy}.log", env)
    return proc, f"http://127.0.0.1:{port}", key


def forget_predictions() -> None:
    """Drop every proxy's published predictor report (a stopped proxy's lingers for its TTL)."""
    from core.redis_client import get_redis

    r = get_redis()
    for name in r.scan_iter(f"{REDIS_PREFIX}predict:*"):
        r.delete(name)


def predictor_errors() -> dict[str, dict[str, Any]]:
    """The running proxy's predictor report (routing/proxy/predict.py), by deployment id, once it has
    published it after the level (every PREDICTIONS_PUBLISH_S)."""
    from core.redis_client import get_redis
    from routing.proxy.predict import PREDICTIONS_PUBLISH_S, merge_reports

    time.sleep(PREDICTIONS_PUBLISH_S + 0.5)
    r = get_redis()
    raws = [r.get(name) for name in r.scan_iter(f"{REDIS_PREFIX}predict:*")]
    return merge_reports([json.loads(raw) for raw in raws if raw])


def busy_model_s(sims: list[SimHandle]) -> list[float]:
    out = []
    for sim in sims:
        with urllib.request.urlopen(sim.base_url + "/sim/stats", timeout=5) as r:
            out.append(float(json.load(r).get("busy_model_s", 0.0)))
    return out


def reset_caches(sims: list[SimHandle]) -> None:
    for sim in sims:
        req = urllib.request.Request(sim.base_url + "/reset_prefix_cache", method="POST", data=b"")
        with contextlib.suppress(OSError):
            urllib.request.urlopen(req, timeout=5).close()


def lost_wall_s(sims: list[SimHandle]) -> float:
    total = 0.0
    for sim in sims:
        with urllib.request.urlopen(sim.base_url + "/sim/stats", timeout=5) as r:
            total += float(json.load(r).get("lost_wall_s", 0.0))
    return total


# ---- one run -----------------------------------------------------------------------------------------


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def warm_up(target: str, key: str, scenario: Scenario, sims: list[SimHandle]) -> None:
    """A few requests through a fresh proxy (its first requests pay one-off costs: LiteLLM imports
    modules on its first calls, the inferchain proxy fills its key cache and connection pools), then
    every engine's prefix cache is emptied again."""
    plan = Plan(
        target=target,
        key=key,
        model=ALIAS,
        items=scenario.items[-8:],
        levels=[Level(clients=4)],
        requests_per_level=8,
        timeout_s=300.0,
        stop_past_knee=False,
    )
    asyncio.run(run(plan, Report(plan), lambda total, label: _NoBar()))
    reset_caches(sims)


def measure(
    target: str, key: str, scenario: Scenario, time_scale: float, seed: int, sims: list[SimHandle]
) -> list[dict[str, Any]]:
    """One closed-loop pass over the scenario's levels; per level, its metrics in modelled time.

    Each level sends its own slice of the workload (level k: requests k*N onwards) and starts with empty
    prefix caches: a prompt sent again at the next level would hit the cache its first sending left,
    and a policy that sends it to the same engine again (round robin does, deterministically) would be
    rewarded for that alone."""
    out = []
    warm = scenario.warmup_requests
    n = scenario.requests_per_level
    for k, clients in enumerate(scenario.levels):
        start = (k * (n + warm)) % len(scenario.items)
        items = [*scenario.items[start:], *scenario.items[:start]]
        reset_caches(sims)
        if warm:
            # The same stream's first `warm` requests, through this policy, unmeasured; then the
            # measured ones continue the stream on the caches the warm-up left.
            plan = Plan(
                target=target,
                key=key,
                model=ALIAS,
                items=items[:warm],
                levels=[Level(clients=clients)],
                requests_per_level=warm,
                max_seconds_per_level=600.0,
                timeout_s=300.0,
                stop_past_knee=False,
                seed=seed,
            )
            asyncio.run(run(plan, Report(plan), lambda total, label: _NoBar()))
            items = items[warm:]
        plan = Plan(
            target=target,
            key=key,
            model=ALIAS,
            items=items,
            levels=[Level(clients=clients)],
            requests_per_level=n,
            max_seconds_per_level=600.0,
            timeout_s=300.0,
            slo=Slo(ttft_s=scenario.slo_ttft_s / time_scale, itl_s=scenario.slo_itl_s / time_scale),
            stop_past_knee=False,
            seed=seed,
        )
        before = engine_metrics(sims)
        busy0 = busy_model_s(sims)
        report = asyncio.run(run(plan, Report(plan), lambda total, label: _NoBar()))
        engines = engine_side(before, engine_metrics(sims))
        extra: dict[str, Any] = {}
        if scenario.cost_per_gpu_hour:
            busy = [b - a for a, b in zip(busy0, busy_model_s(sims), strict=True)]
            extra["predictor"] = predictor_errors()
        for level in report.levels:
            row = {**model_time(level, time_scale), **engines, **extra}
            if scenario.cost_per_gpu_hour:
                row.update(level_cost(scenario, level, busy, time_scale))
            out.append(row)
    return out


def level_cost(scenario: Scenario, level: dict[str, Any], busy: list[float], ts: float) -> dict[str, Any]:
    """Cost per 1,000 output tokens of one level (modelled time): the whole fleet held for the level's
    duration, and each engine's busy seconds only (what a fleet that releases idle engines pays)."""
    rates = [scenario.cost_per_gpu_hour * node.tp / 3600.0 for node in scenario.nodes]  # per second
    wall = level["requests"] / level["requests_per_s"] if level["requests_per_s"] else 0.0
    tokens = level["output_tokens_per_s"] * wall
    if not tokens:
        return {"cost_per_1k_held": None, "cost_per_1k_busy": None}
    held = sum(rates) * wall * ts
    used = sum(rate * b for rate, b in zip(rates, busy, strict=True))
    return {"cost_per_1k_held": held / tokens * 1000, "cost_per_1k_busy": used / tokens * 1000}


def engine_metrics(sims: list[SimHandle]) -> list[Any]:
    """Each engine's /metrics, parsed as the agent parses them."""
    from nodes.engines.metrics import parse_vllm_metrics

    out = []
    for sim in sims:
        with urllib.request.urlopen(sim.base_url + "/metrics", timeout=5) as r:
            out.append(parse_vllm_metrics(r.read().decode()))
    return out


def engine_side(before: list[Any], after: list[Any]) -> dict[str, float | None]:
    """What the engines saw of one measured level: the prefix-cache hit rate (cached prompt tokens /
    prompt tokens) and the TTFT the engines themselves measured from a request's arrival (modelled
    time; interpolated in vLLM's histogram buckets, coarse above 1 s: 1, 2.5, 5). Against the client's
    TTFT that separates what the routing did at the engines from what happened before them."""
    from nodes.engines.metrics import bucket_delta, histogram_quantile, merge_buckets

    pairs = list(zip(after, before, strict=True))
    queries = sum(a.prefix_cache_queries_total - b.prefix_cache_queries_total for a, b in pairs)
    hits = sum(a.prefix_cache_hits_total - b.prefix_cache_hits_total for a, b in pairs)
    ttft = merge_buckets([bucket_delta(a.ttft_buckets, b.ttft_buckets) for a, b in pairs])

    def q(x: float) -> float | None:
        return histogram_quantile(x, ttft)  # the simulator observes modelled time already

    return {
        "prefix_hit_rate": hits / queries if queries else None,
        "engine_ttft_p50_s": q(0.5),
        "engine_ttft_p90_s": q(0.9),
    }


def cold_first_visits(scenario: Scenario) -> list[dict[str, Any]]:
    """Per level, how many measured requests are their prefix group's first in the stream (warm-up
    included): the prefills no policy can avoid."""
    out = []
    warm, n = scenario.warmup_requests, scenario.requests_per_level
    for k, clients in enumerate(scenario.levels):
        start = (k * (n + warm)) % len(scenario.items)
        items = [*scenario.items[start:], *scenario.items[:start]][: warm + n]
        seen: set[str | None] = set()
        first = 0
        for i, item in enumerate(items):
            if item.prefix_group not in seen:
                seen.add(item.prefix_group)
                first += i >= warm
        out.append({"clients": clients, "measured": n, "first_visits": first, "share": first / n})
    return out


def model_time(level: dict[str, Any], ts: float) -> dict[str, Any]:
    def q(dist: dict[str, Any], name: str) -> float | None:
        v = dist.get(name)
        return None if v is None else v * ts

    return {
        "clients": level["clients"],
        "requests": level["requests"],
        "ok": level["ok"],
        "errors": level["errors"],
        "goodput_rps": level["goodput_requests_per_s"] / ts,
        "slo_met_share": level["slo_met_share"],
        "output_tokens_per_s": level["output_tokens_per_s"] / ts,
        "requests_per_s": level["requests_per_s"] / ts,
        "latency_p50_s": q(level["latency_s"], "p50"),
        "latency_p99_s": q(level["latency_s"], "p99"),
        "ttft_p50_s": q(level["ttft_s"], "p50"),
        "ttft_p90_s": q(level["ttft_s"], "p90"),
        "tpot_p50_s": q(level["tpot_s"], "p50"),
    }


METRICS = (
    "cost_per_1k_held",
    "cost_per_1k_busy",
    "goodput_rps",
    "slo_met_share",
    "output_tokens_per_s",
    "latency_p50_s",
    "latency_p99_s",
    "ttft_p90_s",
    "tpot_p50_s",
    "prefix_hit_rate",
    "engine_ttft_p50_s",
    "engine_ttft_p90_s",
)


def medians(reps: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    out = []
    for i, first in enumerate(reps[0]):
        row: dict[str, Any] = {"clients": first["clients"], "reps": len(reps)}
        for m in METRICS:
            values = [r[i][m] for r in reps if i < len(r) and r[i].get(m) is not None]
            row[m] = statistics.median(values) if values else None
        row["errors"] = sum(sum(r[i]["errors"].values()) for r in reps if i < len(r))
        predicted = [r[i]["predictor"] for r in reps if i < len(r) and r[i].get("predictor")]
        if predicted:
            row["predictor"] = predictor_medians(predicted)
        out.append(row)
    return out


def predictor_medians(reports: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per engine (by its order among the deployments: engine 0 is the scenario's first node), the
    median over reps of its predictor's TTFT and TPOT error (MAPE, %) and samples."""
    out: dict[str, dict[str, Any]] = {}
    for report in reports:
        for n, ep in enumerate(sorted(report, key=lambda k: int(k) if k.isdigit() else 0)):
            mine = out.setdefault(str(n), {"ttft_mape_pct": [], "tpot_mape_pct": [], "samples": []})
            for name in mine:
                if report[ep].get(name) is not None:
                    mine[name].append(report[ep][name])
    return {
        ep: {name: statistics.median(values) if values else None for name, values in series.items()}
        for ep, series in out.items()
    }


def markdown(scenario: Scenario, table: dict[str, list[dict[str, Any]]]) -> str:
    lines = [
        f"SLO: TTFT < {scenario.slo_ttft_s:g} s and time per output token < {scenario.slo_itl_s * 1000:g} ms "
        "(modelled time).",
        "",
        "| policy | clients | goodput (req/s) | SLO met | output tok/s | median latency (s) "
        "| P99 latency (s) "
        "| p90 TTFT (s) | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def f(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    for policy, rows in table.items():
        for row in rows:
            lines.append(
                f"| {policy} | {row['clients']} | {f(row['goodput_rps'], '.2f')} "
                f"| {f(row['slo_met_share'], '.0%')} | {f(row['output_tokens_per_s'], '.0f')} "
                f"| {f(row['latency_p50_s'], '.2f')} | {f(row['latency_p99_s'], '.2f')} "
                f"| {f(row['ttft_p90_s'], '.2f')} | {row['errors']} |"
            )
    lines += [f"- {note}" for note in scenario.notes]
    lines += [
        "",
        "What the engines saw (their own /metrics, measured requests only): prefix-cache hit rate "
        "(cached / all prompt tokens) and TTFT from arrival at the engine (modelled time).",
        "",
        "| policy | clients | prefix-cache hits | engine p50 TTFT (s) | engine p90 TTFT (s) "
        "| client p90 TTFT (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for policy, rows in table.items():
        for row in rows:
            lines.append(
                f"| {policy} | {row['clients']} | {f(row.get('prefix_hit_rate'), '.0%')} "
                f"| {f(row.get('engine_ttft_p50_s'), '.2f')} | {f(row.get('engine_ttft_p90_s'), '.2f')} "
                f"| {f(row['ttft_p90_s'], '.2f')} |"
            )
    if scenario.cost_per_gpu_hour:
        lines += [
            "",
            "Cost per 1,000 output tokens (modelled time): the whole fleet held for the level (held), "
            "and each engine's busy time only (busy).",
            "",
            "| policy | clients | held | busy | goodput (req/s) | output tok/s |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for policy, rows in table.items():
            for row in rows:
                lines.append(
                    f"| {policy} | {row['clients']} | {f(row.get('cost_per_1k_held'), '.4f')} "
                    f"| {f(row.get('cost_per_1k_busy'), '.4f')} | {f(row['goodput_rps'], '.2f')} "
                    f"| {f(row['output_tokens_per_s'], '.0f')} |"
                )
        lines += [
            "",
            "Predictor error per engine (MAPE of TTFT and time per output token, exponentially weighted "
            "over its last ~20-40 predictions after warm-up; the proxy learns every pool's engines, "
            "whatever its scorer):",
            "",
            "| policy | clients | engine | samples | TTFT MAPE | TPOT MAPE |",
            "|---|---:|---|---:|---:|---:|",
        ]
        for policy, rows in table.items():
            for row in rows:
                for ep, errs in sorted((row.get("predictor") or {}).items()):
                    node = scenario.nodes[int(ep)].profile if int(ep) < len(scenario.nodes) else "?"
                    ttft, tpot = errs.get("ttft_mape_pct"), errs.get("tpot_mape_pct")
                    lines.append(
                        f"| {policy} | {row['clients']} | {ep}: {node} | {f(errs.get('samples'), '.0f')} "
                        f"| {f(ttft, '.1f')} % | {f(tpot, '.1f')} % |"
                    )
    return "\n".join(lines)


def plot(scenario: Scenario, table: dict[str, list[dict[str, Any]]], path: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2), constrained_layout=True)
    metrics = ("goodput_rps", "latency_p50_s", "latency_p99_s")
    if len(scenario.levels) == 1:  # one load level: a bar per policy
        names = list(table)
        for ax, metric in zip(axes, metrics, strict=True):
            ax.barh(names, [table[p][0][metric] or 0.0 for p in names])
            ax.invert_yaxis()
        for ax in axes[1:]:
            ax.set_yticklabels([])
    colors = [plt.get_cmap("tab20")(i) for i in range(20)]  # more policies than the default 10 colours
    for n, (policy, rows) in enumerate(table.items() if len(scenario.levels) > 1 else ()):
        x = [r["clients"] for r in rows]
        style = "o-" if policy.startswith("chain") or "affinity" in policy else "o--"
        if policy.startswith("litellm:"):
            style = "s:"
        for ax, metric in zip(axes, metrics, strict=True):
            ax.plot(x, [r[metric] for r in rows], style, label=policy, color=colors[n % 20])
    for ax, title in zip(
        axes, ("goodput (req/s meeting the SLO)", "median latency (s)", "P99 latency (s)"), strict=True
    ):
        ax.set_title(title)
        if len(scenario.levels) > 1:
            ax.set_xlabel("concurrent clients")
    if len(scenario.levels) > 1:
        axes[0].legend(fontsize=7)
    else:
        fig.supxlabel(f"{scenario.levels[0]} concurrent clients")
    fig.suptitle(f"routing scenario: {scenario.name} (simulated, modelled time, median of reps)")
    written = []
    for suffix in (".png", ".svg"):
        out = path.with_suffix(suffix)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=90)
        written.append(out)
    plt.close(fig)
    return written


def _at(table: dict[str, list[dict[str, Any]]], policy: str, clients: int) -> dict[str, Any] | None:
    return next((r for r in table.get(policy, []) if r["clients"] == clients), None)


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return "-"
    return "inf" if b == 0 else f"{a / b:.2f}x"


def targets(scenario: str, table: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The issue's targets checked against the medians, one line each (docs/benchmarks.md)."""
    lines: list[str] = []
    litellm = [p for p in table if p.startswith("litellm:")]
    if scenario == "heterogeneous" and "chain" in table:
        for row in table["chain"]:
            c = row["clients"]
            rr = _at(table, "round_robin", c)
            singles = [r for p in ("least_outstanding", "best_fit") if (r := _at(table, p, c))]
            best = max(singles, key=lambda r: r["goodput_rps"] or 0.0, default=None)
            best_name = next((p for p in ("least_outstanding", "best_fit") if _at(table, p, c) is best), "-")
            rr_goodput = rr["goodput_rps"] if rr else None
            line = f"- {c} clients: chain goodput {_ratio(row['goodput_rps'], rr_goodput)} round_robin"
            if best is not None:
                line += (
                    f", {_ratio(row['goodput_rps'], best['goodput_rps'])} {best_name} (best single pool); "
                    f"median {row['latency_p50_s']:.2f} s vs {best['latency_p50_s']:.2f} s"
                )
            for p in litellm:
                other = _at(table, p, c)
                line += f"; {_ratio(row['goodput_rps'], other['goodput_rps'] if other else None)} {p}"
            lines.append(line)
        rr_rows = table.get("round_robin", [])
        if rr_rows:
            top = max(rr_rows, key=lambda r: r["goodput_rps"] or 0.0)
            mine = _at(table, "chain", top["clients"])
            if mine is not None:
                lines.append(
                    f"- at round_robin's best goodput ({top['clients']} clients, "
                    f"{top['goodput_rps']:.2f} req/s): "
                    f"P99 chain {mine['latency_p99_s']:.2f} s vs round_robin {top['latency_p99_s']:.2f} s"
                )
    if scenario == "prefix":
        for p in ("prefix_affinity", "session_affinity"):
            for row in table.get(p, []):
                c = row["clients"]
                rr = _at(table, "round_robin", c)
                if rr is None:
                    continue
                line = (
                    f"- {p} at {c} clients: output tok/s "
                    f"{_ratio(row['output_tokens_per_s'], rr['output_tokens_per_s'])} "
                    f"round_robin; p90 TTFT {_ratio(rr['ttft_p90_s'], row['ttft_p90_s'])} lower"
                )
                for q in litellm:
                    other = _at(table, q, c)
                    if other is not None:
                        line += (
                            f"; vs {q}: tok/s "
                            f"{_ratio(row['output_tokens_per_s'], other['output_tokens_per_s'])}, "
                            f"p90 TTFT {_ratio(other['ttft_p90_s'], row['ttft_p90_s'])} lower"
                        )
                lines.append(line)
    if scenario == "mixed":
        lines += mixed_targets(table)
    return lines


def mixed_targets(table: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The predicted scorers against the best of today's (by goodput) at each level."""
    lines: list[str] = []
    for p in PREDICTED_SCORERS:
        for row in table.get(p, []):
            c = row["clients"]
            today = [(q, r) for q in TODAYS_IN_MIXED if (r := _at(table, q, c))]
            if not today:
                continue
            name, best = max(today, key=lambda qr: qr[1]["goodput_rps"] or 0.0)
            cheapest_name, cheapest = min(today, key=lambda qr: qr[1].get("cost_per_1k_busy") or math.inf)
            line = (
                f"- {p} at {c} clients: goodput {_ratio(row['goodput_rps'], best['goodput_rps'])} {name} "
                f"(best of today's, target >= 1.3x); median {row['latency_p50_s'] or 0:.2f} s vs "
                f"{best['latency_p50_s'] or 0:.2f} s, P99 {row['latency_p99_s'] or 0:.2f} s vs "
                f"{best['latency_p99_s'] or 0:.2f} s"
            )
            for kind in ("held", "busy"):
                mine, theirs = row.get(f"cost_per_1k_{kind}"), best.get(f"cost_per_1k_{kind}")
                if mine is not None and theirs:
                    line += f"; cost per 1k output tokens ({kind}) {mine / theirs:.2f}x {name}'s"
            if cheapest is not best and row.get("cost_per_1k_busy") and cheapest.get("cost_per_1k_busy"):
                line += f" ({row['cost_per_1k_busy'] / cheapest['cost_per_1k_busy']:.2f}x {cheapest_name}'s)"
            line += " (target <= 0.80x at equal or better goodput)"
            errs = row.get("predictor") or {}
            worst = [
                max(v for v in (e.get("ttft_mape_pct"), e.get("tpot_mape_pct")) if v is not None)
                for e in errs.values()
                if e.get("ttft_mape_pct") is not None or e.get("tpot_mape_pct") is not None
            ]
            if worst:
                line += f"; worst engine MAPE {max(worst):.0f} % (target <= 20 %)"
            lines.append(line)
    return lines


# ---- main ----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("scenario", choices=("heterogeneous", "prefix", "homogeneous", "mixed"))
    parser.add_argument("--quick", action="store_true", help="a few requests, one rep, no LiteLLM")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--time-scale", type=float, default=2.0)
    parser.add_argument(
        "--policies", default="", help="comma-separated subset (default: all of the scenario)"
    )
    parser.add_argument("--skip-litellm", action="store_true")
    parser.add_argument(
        "--no-agent",
        action="store_true",
        help="no host agent: the proxy gets no live KV state (best_fit falls back to least outstanding)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=-1,
        help="unmeasured requests before each level (default: the scenario's)",
    )
    parser.add_argument(
        "--clients", default="", help="comma-separated client counts (default: the scenario's)"
    )
    parser.add_argument(
        "--requests", type=int, default=0, help="requests per level (default: the scenario's)"
    )
    parser.add_argument("--plot", default="", help="write the plot to this path (.png and .svg)")
    parser.add_argument("--json-out", default="")
    parser.add_argument(
        "--spill",
        default="",
        help="override the chain's spill caps, e.g. max_inflight=12,max_kv_used=0.6 (default: the demo's)",
    )
    parser.add_argument(
        "--from-json", default="", help="print the tables (and plot) of an earlier run's JSON, run nothing"
    )
    args = parser.parse_args(argv)
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        scenario = build_scenario(saved["scenario"], quick=False)
        table = {p: medians(runs) for p, runs in saved["runs"].items() if runs}
        print(markdown(scenario, table))
        checks = targets(scenario.name, table)
        print("\nTargets (medians):\n" + "\n".join(checks) if checks else "")
        if args.plot:
            for written in plot(scenario, table, Path(args.plot)):
                print(f"plot: {written}")
        return 0

    scenario = build_scenario(args.scenario, args.quick, args.requests)
    for item in filter(None, args.spill.split(",")):
        name, _, value = item.partition("=")
        if name not in CHAIN_SPILL:
            raise SystemExit(f"--spill: unknown cap {name!r}; use {', '.join(CHAIN_SPILL)}")
        CHAIN_SPILL[name] = float(value) if name == "max_kv_used" else int(value)
    if args.clients:
        scenario.levels = tuple(int(c) for c in args.clients.split(","))
    if args.requests:
        scenario.requests_per_level = args.requests
    if args.warmup >= 0:
        scenario.warmup_requests = args.warmup
    policies = list(scenario.policies)
    if not (args.quick or args.skip_litellm):
        policies += [f"litellm:{s}" for s in LITELLM_STRATEGIES]
    if args.policies:
        wanted = args.policies.split(",")
        policies = [p for p in policies if p in wanted]
    reps = 1 if args.quick else args.reps
    ts = args.time_scale
    logs = Path(tempfile.mkdtemp(prefix=f"routebench-{args.scenario}-"))
    results: dict[str, list[list[dict[str, Any]]]] = {p: [] for p in policies}
    notes: dict[str, Any] = {}
    litellm: dict[str, tuple[Any, str, str]] = {}
    reasons: dict[str, dict[str, int]] = {}
    if scenario.warmup_requests:
        notes["warmup_requests"] = scenario.warmup_requests
        notes["cold_first_visits"] = cold_first_visits(scenario)
    sims = start_engines(scenario, ts)
    started = time.perf_counter()
    try:
        with bench_database("postgres", f"routes_{args.scenario}") as db_url, contextlib.ExitStack() as stack:
            key = setup_database(db_url, scenario, sims)
            notes["host_agent"] = not args.no_agent
            if not args.no_agent:
                stack.enter_context(host_agent(db_url, scenario, ts, logs))
            if any(p.startswith("litellm:") for p in policies):
                exe, why = ensure_litellm()
                if exe is None:
                    notes["litellm"] = why
                    policies = [p for p in policies if not p.startswith("litellm:")]
                else:
                    for p in [p for p in policies if p.startswith("litellm:")]:
                        litellm[p] = start_litellm(exe, scenario, sims, p.split(":", 1)[1], logs)
                    for p, (proc, url, _k) in list(litellm.items()):
                        try:
                            wait_ready(url + "/health/liveliness", proc, timeout=240)
                        except RuntimeError as exc:
                            notes[p] = str(exc)
                            policies.remove(p)
            lost0 = lost_wall_s(sims)
            for rep in range(reps):
                for policy in policies:
                    t0 = time.perf_counter()
                    if policy.startswith("litellm:"):
                        _proc, url, lkey = litellm[policy]
                        warm_up(url, lkey, scenario, sims)
                        levels = measure(url, lkey, scenario, ts, seed=rep, sims=sims)
                    else:
                        from django.utils import timezone

                        configure_policy(policy)
                        since = timezone.now()
                        slo = (scenario.slo_ttft_s / ts, scenario.slo_itl_s / ts)
                        with inferchain_proxy(db_url, logs, seed=SEED + rep, slo=slo) as url:
                            warm_up(url, key, scenario, sims)
                            levels = measure(url, key, scenario, ts, seed=rep, sims=sims)
                        mine = reasons.setdefault(policy, {})
                        for reason, count in route_reasons(since).items():
                            mine[reason] = mine.get(reason, 0) + count
                    results[policy].append(levels)
                    print(
                        f"rep {rep + 1}/{reps} {policy}: {time.perf_counter() - t0:.1f} s, "
                        + ", ".join(
                            f"{lv['clients']}c goodput {lv['goodput_rps']:.2f} "
                            f"p50 {lv['latency_p50_s'] or 0:.2f}"
                            for lv in levels
                        ),
                        file=sys.stderr,
                        flush=True,
                    )
            notes["sim_lost_wall_s"] = lost_wall_s(sims) - lost0
            notes["route_reasons"] = reasons
    finally:
        for proc, _url, _k in litellm.values():
            stop(proc)
        for sim in sims:
            sim.stop()
        shutil.rmtree(logs, ignore_errors=True)
    table = {p: medians(results[p]) for p in policies if results[p]}
    print(
        f"## {scenario.name}: {len(scenario.nodes)} engines, time scale {ts:g}, {reps} reps, "
        f"{time.perf_counter() - started:.0f} s"
    )
    print()
    print(markdown(scenario, table))
    checks = targets(scenario.name, table)
    if checks:
        print("\nTargets (medians):")
        print("\n".join(checks))
    print(
        "\nsimulator time lost to a busy CPU (all engines, whole run): "
        f"{notes.get('sim_lost_wall_s', 0):.2f} s"
    )
    print(f"host agent (live KV state): {'yes' if notes.get('host_agent') else 'no'}")
    for level in notes.get("cold_first_visits", []):
        print(
            f"warm-up {scenario.warmup_requests} requests per level; measured requests that are their "
            f"tenant's first ({level['clients']} clients): {level['first_visits']}/{level['measured']} "
            f"({level['share']:.1%})"
        )
    if reasons:
        print("\nroute reasons (request log, all reps and levels, incl. warm-up):")
        for policy, counts in reasons.items():
            total = sum(counts.values()) or 1
            top = sorted(counts.items(), key=lambda kv: -kv[1])
            print(f"- {policy}: " + ", ".join(f"{r} {c / total:.0%}" for r, c in top))
    out = Path(args.json_out or BENCH_DIR / f"routing_{args.scenario}{'_quick' if args.quick else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "scenario": scenario.name,
                "time_scale": ts,
                "reps": reps,
                "levels": scenario.levels,
                "requests_per_level": scenario.requests_per_level,
                "litellm_version": LITELLM_VERSION,
                "warmup_requests": scenario.warmup_requests,
                "notes": notes,
                "chain_spill": CHAIN_SPILL,
                "medians": table,
                "runs": results,
            },
            indent=2,
        )
    )
    if args.plot:
        for written in plot(scenario, table, Path(args.plot)):
            print(f"plot: {written}")
    return 0 if table and all(r["errors"] == 0 for rows in table.values() for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
