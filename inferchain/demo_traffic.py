"""Demo-only background load through the proxy, so a newcomer's dashboard, request log and routing page
move without setting up a client.

Its own process, `manage.py demo_traffic --rate RPS --url PROXY` (the Procfile's `traffic`), so the node
agent carries no demo code: about RPS requests a second per ready simulated engine of the fleet, sent to
the proxy with the demo-traffic key that `manage.py seed_demo` leaves in var/demo-traffic.key (mode
0600). So they pass auth, limits and routing like any client's, and show in the request log, the
routing split and the usage charts as tenant "demo-traffic". Mostly short chats (the fast pool), some
`x-task: summarize` and some long documents (the long-context pool).
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from django.db import close_old_connections

from nodes.choices import DeploymentState, Engine
from nodes.models import Deployment

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 16
REFRESH_S = 5.0
# fmt: off
WORDS = (
    "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "engines",
    "serve", "tokens", "to", "many", "tenants", "every", "request", "waits", "in", "a", "queue",
    "until", "the", "scheduler", "finds", "room", "in", "the", "cache", "for", "its", "prompt",
    "and", "then", "the", "model", "writes", "one", "token", "after", "another", "until", "it",
    "reaches", "the", "end",
)
# fmt: on
SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You answer briefly and precisely.",
    "You are a support agent for an inference platform.",
)


def _words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def demo_request(rng: random.Random, model: str) -> tuple[dict[str, Any], dict[str, str]]:
    """One demo chat request: (body, extra headers). Long ones exercise the long-context pool."""
    roll = rng.random()
    if roll < 0.05:
        # A long document: over the fast pool's 6,000-token limit, so the policy sends it to llama-long.
        messages = [{"role": "user", "content": "Summarize this report:\n" + _words(rng, 6500, 9000)}]
        return {"model": model, "messages": messages, "max_tokens": rng.randint(64, 256)}, {}
    if roll < 0.15:
        messages = [{"role": "user", "content": "Summarize: " + _words(rng, 300, 1500)}]
        body = {"model": model, "messages": messages, "max_tokens": rng.randint(32, 128)}
        return body, {"x-task": "summarize"}
    messages = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    for _ in range(rng.randint(0, 2)):
        messages.append({"role": "user", "content": _words(rng, 5, 60)})
        messages.append({"role": "assistant", "content": _words(rng, 5, 80)})
    messages.append({"role": "user", "content": _words(rng, 20, 400)})
    return {"model": model, "messages": messages, "max_tokens": rng.randint(16, 384)}, {}


def read_key(path: Path) -> str | None:
    """The demo-traffic key the seed wrote, or None while there is none."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def send_one(base_url: str, key: str, body: dict[str, Any], headers: dict[str, str]) -> int | None:
    """POST one chat completion through the proxy; its HTTP status, or None when it did not answer."""
    request = urllib.request.Request(
        base_url.rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json", **headers},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        exc.read()
        return int(exc.code)
    except OSError as exc:
        log.debug("demo request to %s failed: %s", base_url, exc)
        return None


class DemoTraffic:
    """The generator's state: where to send, with which key, and how many requests are in flight."""

    def __init__(self, proxy_url: str, key_file: Path) -> None:
        self.proxy_url = proxy_url
        self.key_file = key_file
        self.key: str | None = None
        self.models: list[str] = []
        self.refused = False
        self.in_flight = 0
        self.lock = threading.Lock()
        self._waiting_said = False

    def refresh(self) -> None:
        """Re-read the key (a new `seed_demo` rotates it) and the fleet's ready simulated engines."""
        close_old_connections()
        self.models = list(
            Deployment.objects.filter(engine=Engine.SIM, state=DeploymentState.READY).values_list(
                "served_model_name", flat=True
            )
        )
        key = read_key(self.key_file)
        if key is None and not self._waiting_said:
            log.info("demo traffic waits for %s (manage.py seed_demo writes it)", self.key_file)
        self._waiting_said = key is None
        if key != self.key:
            self.refused = False
        self.key = key

    def send(self, model: str, rng: random.Random) -> None:
        key = self.key
        if key is None:
            return
        body, headers = demo_request(rng, model)
        try:
            status = send_one(self.proxy_url, key, body, headers)
        finally:
            with self.lock:
                self.in_flight -= 1
        if status == 401 and not self.refused:
            self.refused = True
            log.info("the proxy refused the demo-traffic key (revoked?); waiting for a new %s", self.key_file)

    def submit(self, pool: ThreadPoolExecutor, rng: random.Random) -> None:
        if self.key is None or self.refused:
            return
        for model in self.models:
            with self.lock:
                if self.in_flight >= MAX_IN_FLIGHT:
                    return
                self.in_flight += 1
            pool.submit(self.send, model, rng)


def run_demo_traffic(rate_per_s: float, stop: threading.Event, proxy_url: str, key_file: Path) -> None:
    """Poisson-ish arrivals at `rate_per_s` per ready simulated engine, at most 16 in flight."""
    rng = random.Random()
    traffic = DemoTraffic(proxy_url, key_file)
    pool = ThreadPoolExecutor(max_workers=MAX_IN_FLIGHT, thread_name_prefix="demo-traffic")
    refreshed = float("-inf")
    try:
        while not stop.is_set():
            if time.monotonic() - refreshed > REFRESH_S:
                try:
                    traffic.refresh()
                except Exception as exc:  # a database hiccup must not end the demo traffic
                    log.debug("demo traffic refresh failed: %s", exc)
                refreshed = time.monotonic()
            traffic.submit(pool, rng)
            stop.wait(rng.expovariate(rate_per_s) if rate_per_s > 0 else REFRESH_S)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
