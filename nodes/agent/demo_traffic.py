"""Demo-only background load: small completions sent straight to this host's simulated engines,
so a newcomer's dashboard shows moving GPU and engine charts without setting up a client.

Enabled by `run_agent --demo-traffic RPS` (the Procfile does it for the demo hosts). It only
ever targets `sim` engines and uses their engine key like the proxy does.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from django.db import close_old_connections

from nodes.choices import DeploymentState, Engine
from nodes.lifecycle import engine_api_key
from nodes.models import Deployment

log = logging.getLogger(__name__)

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "engines",
    "serve",
    "tokens",
    "to",
    "many",
    "tenants",
]


def send_one(url: str, key: str, model: str, rng: random.Random) -> None:
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 400)))
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": rng.randint(16, 384)}).encode()
    request = urllib.request.Request(
        url + "/v1/completions",
        data=body,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        urllib.request.urlopen(request, timeout=60).read()
    except OSError as exc:
        log.debug("demo request to %s failed: %s", url, exc)


def run_demo_traffic(host_name: str, rate_per_s: float, stop: threading.Event) -> None:
    """Poisson-ish arrivals at `rate_per_s` per ready simulated engine, at most 16 in flight."""
    rng = random.Random()
    pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="demo-traffic")
    targets: list[tuple[str, str, str]] = []
    refreshed = 0.0
    while not stop.is_set():
        if time.monotonic() - refreshed > 5:
            close_old_connections()
            targets = [
                (d.base_url, engine_api_key(d), d.served_model_name)
                for d in Deployment.objects.select_related("host").filter(
                    host__name=host_name, engine=Engine.SIM, state=DeploymentState.READY
                )
            ]
            refreshed = time.monotonic()
        for url, key, model in targets:
            pool.submit(send_one, url, key, model, rng)
        stop.wait(rng.expovariate(rate_per_s) if rate_per_s > 0 else 5)
    pool.shutdown(wait=False, cancel_futures=True)
