"""The scaler with real simulator engines, their agent's supervisor and the real proxy: load through the
proxy makes the pool grow by an engine that the proxy then uses, and when the load falls the added
engine is drained and stopped while clients keep calling, without one failed request."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import openai
import pytest
from django.utils import timezone

from models_registry.models import ModelAlias
from nodes import process
from nodes.agent import runtime
from nodes.choices import DeploymentState
from nodes.models import Deployment, Host
from routing.scaling import autoscaler
from routing.scaling.models import ScalingDecision
from tests.nodes.conftest import READY, supervisor_for, tick_until
from tests.nodes.scaling_helpers import ROLE, make_policy
from tests.routing import conftest as routing_fixtures
from tests.routing.conftest import Proc, make_tenant_key

# The routing tests' proxy fixture (starts `python -m routing.proxy` processes), used here by name.
start_proxy = routing_fixtures.start_proxy


def later(seconds: float) -> datetime:
    """Evaluation times ahead of the clock, so each step is its own interval and cooldowns pass."""
    return timezone.now() + timedelta(seconds=seconds)


pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


class Clients:
    """`n` threads calling the proxy in a loop; every failure is kept."""

    def __init__(self, proxy: Proc, key: str, n: int, max_tokens: int) -> None:
        self.client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0, timeout=60)
        self.max_tokens = max_tokens
        self.stop = threading.Event()
        self.ok = 0
        self.failures: list[str] = []
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(n)]
        for t in self.threads:
            t.start()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                reply = self.client.completions.create(
                    model="llama-3.1-8b",
                    prompt="tell a story",
                    max_tokens=self.max_tokens,
                    extra_body={"ignore_eos": True},
                )
                assert reply.usage is not None and reply.usage.completion_tokens == self.max_tokens
                self.ok += 1
            except Exception as exc:  # every failure is the test's finding
                self.failures.append(repr(exc))

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)


def test_pool_grows_under_load_and_drains_without_a_failed_request(
    host: Host,
    make_deployment: Any,
    start_proxy: Callable[..., Proc],
    redis_clean: None,
) -> None:
    Host.objects.filter(pk=host.pk).update(role=ROLE)
    # Two sequences at a time: twelve clients queue on one engine.
    template = make_deployment(role=ROLE, max_num_seqs=2, extra_args=["--sim-time-scale", "20"])
    ModelAlias.objects.create(name="llama-3.1-8b", active_version=template.model_version)
    supervisor = supervisor_for(host)
    supervisor.start()
    runtime.launch(template.pk)
    tick_until(supervisor, template, READY)
    policy = make_policy(template, max_engines=2, scale_down_cooldown_s=0)

    ticking = threading.Event()

    def tick() -> None:  # the agent's supervisor: probes and live records every 0.2 s
        while not ticking.is_set():
            supervisor.tick()
            time.sleep(0.2)

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    proxy = start_proxy()
    key = make_tenant_key().raw_key
    busy = Clients(proxy, key, n=12, max_tokens=64)
    try:
        decision = None
        for step in range(50):
            decision = autoscaler.evaluate(policy.pk, now=later(step * 10))
            if decision is not None:
                break
            time.sleep(0.2)
        assert decision is not None and decision.action == ScalingDecision.Action.SCALE_UP, policy.last_reason
        added = Deployment.objects.get(pk=decision.metrics["added_ids"][0])
        runtime.launch(added.pk)  # what the host's agent does with the queued launch
        deadline = time.monotonic() + 30
        while added.state != DeploymentState.READY and time.monotonic() < deadline:
            time.sleep(0.2)
            added.refresh_from_db()
        assert added.state == DeploymentState.READY
        served_before = busy.ok
        time.sleep(2.0)
        busy.close()
        assert busy.failures == [] and busy.ok > served_before

        # Light load: two clients, long answers, so the engine to remove has a request running.
        light = Clients(proxy, key, n=2, max_tokens=200)
        try:
            removal = None
            for step in range(60, 200):
                removal = autoscaler.evaluate(policy.pk, now=later(step * 10))
                # The busy phase's queue may still show in a live record for a round (a `blocked`).
                if removal is not None and removal.action == ScalingDecision.Action.SCALE_DOWN:
                    break
                time.sleep(0.2)
            assert removal is not None and removal.action == ScalingDecision.Action.SCALE_DOWN, (
                policy.last_reason
            )
            assert removal.metrics["removed_id"] == added.pk
            pid = added.pid
            assert runtime.stop(added.pk, drain=True) == "stopped"  # the agent's drain
            time.sleep(1.0)
        finally:
            light.close()
        assert light.failures == [] and light.ok > 0
        added.refresh_from_db()
        assert added.state == DeploymentState.STOPPED and pid is not None and not process.is_alive(pid)
        template.refresh_from_db()
        assert template.state == DeploymentState.READY
    finally:
        busy.close()
        ticking.set()
        ticker.join(5)
        supervisor.close()
