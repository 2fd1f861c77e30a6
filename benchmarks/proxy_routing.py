"""Route decision time per scorer: how long choosing an endpoint takes, in microseconds.

    .venv/bin/python benchmarks/proxy_routing.py [--endpoints 8]

Times `routing.proxy.scorers.choose` (the part of the decision that grows with the pool) for each
scorer over `--endpoints` candidates with varied loads and KV headroom, 20,000 decisions per
repetition, median of 5 repetitions. The predicted scorers (`predicted_latency`, `slo_cost`) get warm
latency models (routing/proxy/predict.py) with varied weights, so they evaluate every candidate's
prediction, not the cold fallback. The proxy exports the whole decision (policy rules + this)
as `inferchain_proxy_route_decision_seconds`.

Then the prefix key that `prefix_affinity` and `weighted` are given, built once per request at
admission: one hash of the first 16 full blocks of 16 token ids (`token_prefix_key`, when the
version's tokenizer is known) or of 64-character blocks (`prefix_key`, without one).

Last, the proxy's own part of the decision before the scorer (`Proxy._pick_pool` and
`Proxy._candidates`: policy rules, the pool's endpoints that fit and are available) for an alias
whose pool has `--endpoints` endpoints of its active version and, where the snapshot knows about
versions, as many staged endpoints of another version (which the decision must not look at).

Last, version selection plus the canary draw (`Proxy._route`: the part above plus, for a pool whose
alias has an active rollout, the draw by a hash of the session header and the candidate's
endpoints that fit): the same pool without a rollout and with one at 5% (sticky by session, 1,000
distinct sessions in turn), in alternating blocks of 500 decisions timed in this process's CPU time;
the difference of the two medians is what the canary adds per request.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from routing.choices import Scorer
from routing.proxy.predict import MIN_SAMPLES, EndpointModel
from routing.proxy.scorers import EndpointLoad, ScoreRequest, choose, prefix_key, token_prefix_key


def warm_model(rng: random.Random, endpoint_id: str) -> EndpointModel:
    """A warm latency model (routing/proxy/predict.py) with plausible weights, for the predicted scorers."""
    m = EndpointModel(endpoint_id)
    m.ttft.w = [
        rng.uniform(0.01, 0.05),
        rng.uniform(0.02, 0.2),
        rng.uniform(0.01, 0.1),
        rng.uniform(0.0, 0.05),
    ]
    m.tpot.w = [
        rng.uniform(0.005, 0.03),
        rng.uniform(0.001, 0.01),
        rng.uniform(0.0, 0.01),
        rng.uniform(0.0, 0.02),
    ]
    m.ttft.n = m.tpot.n = MIN_SAMPLES
    m.inflight, m.inflight_prompt = rng.randrange(0, 40), rng.randrange(0, 100_000)
    m.peak_tokens_per_s = rng.uniform(200, 3000)
    m.refresh()
    return m


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--endpoints", type=int, default=8)
    parser.add_argument("--decisions", type=int, default=20_000)
    args = parser.parse_args()
    rng = random.Random(7)
    loads = [
        EndpointLoad(
            endpoint_id=str(i),
            inflight=rng.randrange(0, 40),
            kv_free_tokens=rng.randrange(0, 60_000),
            kv_total_tokens=65_536,
            max_inflight=64,
            model=warm_model(rng, str(i)),
            cost_per_hour=rng.choice([1.0, 2.5, 8.0]),
        )
        for i in range(args.endpoints)
    ]
    prompts = [f"system prompt {i % 10} " * 60 + f"question {i}" for i in range(100)]
    requests = [
        ScoreRequest(
            tokens_needed=rng.randrange(100, 8000),
            prefix_key=prefix_key(p),
            session_key=f"s{i}",
            prompt_tokens=rng.randrange(50, 6000),
            output_tokens=rng.randrange(1, 1000),
            # A third of the requests meet their targets nowhere (the scorer then looks at every one).
            ttft_target_s=rng.choice([0.5, 2.0, 0.001]),
            tpot_target_s=0.1,
        )
        for i, p in enumerate(prompts)
    ]
    weights = {"load": 1.0, "kv": 1.0, "prefix": 0.5}
    print(f"| scorer | us per decision ({args.endpoints} endpoints, median of 5) |")
    print("|---|---:|")
    for scorer in Scorer:
        reps = []
        for _ in range(5):
            t0 = time.perf_counter()
            for n in range(args.decisions):
                choose(scorer.value, loads, requests[n % 100], weights=weights, rr=n)
            reps.append((time.perf_counter() - t0) / args.decisions * 1e6)
        print(f"| {scorer.value} | {statistics.median(reps):.2f} |")
    id_prompts = [[rng.randrange(50_000) for _ in range(400)] for _ in range(100)]
    print()
    print("| prefix key | us per request (median of 5) |")
    print("|---|---:|")
    builds: list[tuple[str, Callable[[Any], bytes | None], Sequence[Any]]] = [
        ("token blocks (256 of 400 ids)", token_prefix_key, id_prompts),
        ("character blocks (1024 characters)", prefix_key, prompts),
    ]
    for label, build, inputs in builds:
        reps = []
        for _ in range(5):
            t0 = time.perf_counter()
            for n in range(args.decisions):
                build(inputs[n % 100])
            reps.append((time.perf_counter() - t0) / args.decisions * 1e6)
        print(f"| {label} | {statistics.median(reps):.2f} |")
    print()
    proxy_decision(args.endpoints, args.decisions)


def proxy_decision(endpoints: int, decisions: int) -> None:
    import django  # late: the scorer timings above need no Django settings

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inferchain.settings")
    django.setup()
    from routing.proxy.app import Proxy, RequestContext
    from routing.proxy.config import Endpoint, KeyInfo, Limits, Policy, Pool, RoutingSnapshot, Rule

    has_versions = "version_id" in Endpoint.__dataclass_fields__

    def endpoint(i: int, version: int) -> Endpoint:
        extra: dict[str, Any] = {"version_id": version} if has_versions else {}
        return Endpoint(
            **extra,
            id=str(i),
            deployment_id=i,
            base_url=f"http://127.0.0.1:{9000 + i}",
            api_key="",
            served_model_name="m",
            max_model_len=8192,
            block_size=16,
        )

    active = [endpoint(i, 1) for i in range(endpoints)]
    pool = Pool(name="m", alias="m", endpoints=active)
    versioned = "staged" in Pool.__dataclass_fields__
    if versioned:
        pool = Pool(
            name="m",
            alias="m",
            endpoints=active,
            version_id=1,
            staged={2: [endpoint(endpoints + i, 2) for i in range(endpoints)]},
        )
    policy = Policy(
        name="p",
        alias="m",
        rules=(Rule(pool="m", tasks=frozenset({"summarize"})), Rule(pool="m", max_prompt_tokens=6000)),
        default_pool="m",
        fallback_pool=None,
    )
    proxy = Proxy()
    proxy.snapshot = RoutingSnapshot(pools={"m": pool}, policies={"m": policy}, aliases=("m",))
    key = KeyInfo(1, "k", "h", 1, "t", True, False, frozenset(), None, False, Limits(), Limits())
    ctx = RequestContext(request_id="r", kind="chat", started=0.0, key=key, prompt_tokens=900)
    reps = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(decisions):
            chosen, _reason = proxy._pick_pool(policy, "m", ctx, None)
            proxy._candidates(chosen, policy, 900, 256)
        reps.append((time.perf_counter() - t0) / decisions * 1e6)
    staged = f" + {endpoints} staged of another version" if versioned else " (no version data)"
    print("| proxy decision before the scorer | us per request (median of 5) |")
    print("|---|---:|")
    label = f"policy (2 rules) + candidates, {endpoints} active endpoints{staged}"
    print(f"| {label} | {statistics.median(reps):.2f} |")
    print()
    canary_decision(endpoints, decisions)


def canary_decision(endpoints: int, decisions: int) -> None:
    """`Proxy._route` for a pool without a rollout and with a 5% canary, interleaved (Django is set up)."""
    from routing.proxy.app import Proxy, RequestContext
    from routing.proxy.config import (
        Canary,
        Endpoint,
        KeyInfo,
        Limits,
        Policy,
        Pool,
        RoutingSnapshot,
        Rule,
        share_threshold,
    )

    def endpoint(i: int, version: int) -> Endpoint:
        return Endpoint(
            id=str(i),
            deployment_id=i,
            base_url=f"http://127.0.0.1:{9000 + i}",
            api_key="",
            served_model_name="m",
            max_model_len=8192,
            block_size=16,
            version_id=version,
        )

    staged = [endpoint(endpoints + i, 2) for i in range(endpoints)]
    plain = Pool(
        name="m",
        alias="m",
        endpoints=[endpoint(i, 1) for i in range(endpoints)],
        version_id=1,
        staged={2: staged},
    )
    canary = Canary(
        rollout_id=7,
        version_id=2,
        share=5.0,
        sticky_by="session",
        endpoints=staged,
        salt=b"7:",
        threshold=share_threshold(5.0),
    )
    with_canary = Pool(
        name="m", alias="m", endpoints=plain.endpoints, version_id=1, staged=plain.staged, canary=canary
    )
    policy = Policy(
        name="p",
        alias="m",
        rules=(Rule(pool="m", tasks=frozenset({"summarize"})), Rule(pool="m", max_prompt_tokens=6000)),
        default_pool="m",
        fallback_pool=None,
    )
    proxy = Proxy()
    key = KeyInfo(1, "k", "h", 1, "t", True, False, frozenset(), None, False, Limits(), Limits())
    ctx = RequestContext(request_id="r", kind="chat", started=0.0, key=key, prompt_tokens=900)
    # Headers as the openai client sends them, the session last (the header scan's worst case).
    base = [
        (b"host", b"127.0.0.1:8001"),
        (b"accept", b"application/json"),
        (b"content-type", b"application/json"),
        (b"user-agent", b"OpenAI/Python 2.0"),
        (b"authorization", b"Bearer ic-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"),
        (b"content-length", b"120"),
    ]
    scopes = [{"headers": [*base, (b"x-session-id", f"conversation-{i}".encode())]} for i in range(1000)]
    # Blocks of 500 decisions, the two pools alternating block by block, each block timed in CPU time
    # of this process (time.process_time: a shared machine's other load stalls the wall clock, not
    # this), and the median block taken: the two are measured under the same conditions.
    block = 500
    reps: dict[str, list[float]] = {"none": [], "canary": []}
    pools = {"none": plain, "canary": with_canary}
    snapshots = {
        label: RoutingSnapshot(pools={"m": pool}, policies={"m": policy}, aliases=("m",))
        for label, pool in pools.items()
    }
    for n in range(max(2, decisions // block)):
        for label in ("none", "canary") if n % 2 else ("canary", "none"):
            proxy.snapshot = snapshots[label]
            t0 = time.process_time()
            for i in range(block):
                proxy._route(ctx, scopes[(n * block + i) % 1000], policy, "m", 900, 256)
            reps[label].append((time.process_time() - t0) / block * 1e6)
    proxy.snapshot = snapshots["canary"]
    on_candidate = 0
    for scope in scopes:
        ctx.arm = "primary"
        proxy._route(ctx, scope, policy, "m", 900, 256)
        on_candidate += ctx.arm == "canary"
    none, with_ = statistics.median(reps["none"]), statistics.median(reps["canary"])
    print(
        f"| route decision before the scorer (`Proxy._route`, {endpoints} + {endpoints} endpoints) "
        "| us per request (CPU time, median of alternating blocks) |"
    )
    print("|---|---:|")
    print(f"| no rollout (version selection only: done at snapshot load) | {none:.2f} |")
    print(f"| canary at 5%, sticky by session ({on_candidate} of 1,000 sessions drawn) | {with_:.2f} |")
    print(f"| added by the canary draw | {with_ - none:.2f} |")


if __name__ == "__main__":
    main()
