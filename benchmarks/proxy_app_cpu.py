"""CPU per request of the proxy's ASGI app alone (no HTTP server, no client), for A/B of hot-path code.

    PYTHONPATH=<tree> .venv/bin/python benchmarks/proxy_app_cpu.py BACKEND_PORT REQUESTS REPS json|stream

Run from the checkout to measure (PYTHONPATH and the working directory both that tree), against
`benchmarks/trivial_backend.py --port BACKEND_PORT`, alternating two trees several times (see
docs/benchmarks.md, "Pipeline refactor"). The app gets a hand-made routing snapshot (one static
endpoint) and a cached key of a tenant without a quota, so neither the database nor Redis is touched;
each request is one `await app(scope, receive, send)` with the body in one message. Prints the CPU time
of this process per request, in microseconds, for each of REPS blocks of REQUESTS requests.

Under `valgrind --tool=callgrind --instr-atstart=no` with PROXY_APP_CPU_CALLGRIND=1, callgrind's
instrumentation is switched on for the timed blocks only (`callgrind_control`), so the instructions it
reports are those of the requests (benchmarks/proxy_app_ab.py --instructions).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from typing import Any

import django
import orjson
import uvloop

RAW = "ick_" + "Q" * 43
BENCH_QUOTA = {  # as proxy_overhead.py's
    "requests_per_minute": 1_000_000,
    "tokens_per_minute": 1_000_000_000,
    "max_concurrent_requests": 100_000,
    "daily_token_budget": 10**15,
}


async def measure(port: int, requests: int, reps: int, stream: bool) -> list[float]:
    # Late: Django is set up first (main).
    import redis.asyncio as aioredis

    from console.services import hash_api_key
    from routing.proxy.app import Proxy
    from routing.proxy.config import Endpoint, KeyInfo, Limits, Pool, RoutingSnapshot

    body = orjson.dumps(
        {
            "model": "trivial",
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 16,
            "stream": stream,
        }
    )
    p = Proxy()
    p.attach_redis(aioredis.Redis.from_url(os.environ["REDIS_URL"]))
    ep = Endpoint(
        id="t",
        deployment_id=None,
        base_url=f"http://127.0.0.1:{port}",
        api_key="",
        served_model_name="trivial",
        max_model_len=None,
        block_size=16,
    )
    p.snapshot = RoutingSnapshot(
        pools={"trivial": Pool(name="trivial", alias="trivial", endpoints=[ep])},
        aliases=("trivial",),
        endpoints={"t": ep},
    )
    digest = hash_api_key(RAW)
    # PROXY_APP_CPU_QUOTA=1: the tenant has proxy_overhead.py's quota (every counted limit, far above the
    # load), so each request takes the limiter's path against REDIS_URL, as real tenants' requests do.
    quota = Limits(**BENCH_QUOTA) if os.environ.get("PROXY_APP_CPU_QUOTA") == "1" else Limits()
    info = KeyInfo(1, "ick_QQQQ", digest, 1, "t", True, False, frozenset(), None, False, quota, Limits())
    # The key cache: a service object since the pipeline split, a dict on the app before it.
    cache = p.services.keys.keys if hasattr(p, "services") else p.keys  # type: ignore[attr-defined]
    cache[digest] = (info, time.monotonic())
    p.pubsub_healthy = True
    scope = {
        "type": "http",
        "path": "/v1/chat/completions",
        "method": "POST",
        "headers": [
            (b"host", b"x"),
            (b"authorization", b"Bearer " + RAW.encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
    }
    never: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    async def one() -> None:
        sent: list[dict[str, Any]] = []
        first = True

        async def receive() -> dict[str, Any]:
            nonlocal first
            if first:
                first = False
                return {"type": "http.request", "body": body, "more_body": False}
            return await never  # the client never leaves

        async def send(msg: dict[str, Any]) -> None:
            sent.append(msg)

        await p(scope, receive, send)
        assert sent[0]["status"] == 200, sent

    for _ in range(500):
        await one()
    if os.environ.get("PROXY_APP_CPU_PROFILE"):
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
        for _ in range(requests):
            await one()
        prof.disable()
        prof.dump_stats(os.environ["PROXY_APP_CPU_PROFILE"])
    out = []
    callgrind = os.environ.get("PROXY_APP_CPU_CALLGRIND") == "1"
    if callgrind:
        subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True, capture_output=True)
    for _ in range(reps):
        t0 = time.process_time()
        for _ in range(requests):
            await one()
        out.append((time.process_time() - t0) / requests * 1e6)
    if callgrind:
        subprocess.run(["callgrind_control", "-i", "off", str(os.getpid())], check=True, capture_output=True)
    return out


def main() -> None:
    port, requests, reps, mode = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inferchain.settings")
    django.setup()
    uvloop.install()
    print(" ".join(f"{v:.1f}" for v in asyncio.run(measure(port, requests, reps, mode == "stream"))))


if __name__ == "__main__":
    main()
