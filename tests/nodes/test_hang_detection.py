"""Progress-based health: a hung engine (requests running, no tokens) is killed and restarted,
while a busy engine that is too slow to answer probes but produces tokens stays ready."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.request
from typing import Any

import pytest

from nodes.agent import runtime
from nodes.agent.supervisor import Observation
from nodes.choices import DeploymentState
from nodes.engines.metrics import EngineMetrics
from nodes.lifecycle import engine_api_key
from tests.nodes.conftest import READY, in_state, supervisor_for, tick_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def send_completion(port: int, key: str, max_tokens: int = 64) -> None:
    body = json.dumps({"model": "llama-3.1-8b", "prompt": "hello", "max_tokens": max_tokens}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=body,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    # The hung engine is killed under this request, so it ends in a connection error.
    with contextlib.suppress(OSError):
        urllib.request.urlopen(request, timeout=30).read()


@pytest.mark.parametrize("second_request", ["while the first runs", "after the first finished"])
def test_hung_engine_is_detected_and_restarted(
    host: Any, make_deployment: Any, node_settings: Any, second_request: str
) -> None:
    node_settings.NODE_HANG_SECONDS = 2.0
    # The second request stops the simulator's stepping while /health keeps answering 200.
    deployment = make_deployment(extra_args=["--sim-time-scale", "50", "--sim-hang-after", "1"])
    supervisor = supervisor_for(host)
    supervisor.start()
    runtime.launch(deployment.pk)
    deployment = tick_until(supervisor, deployment, READY)
    hung_pid = deployment.pid
    key = engine_api_key(deployment)
    if second_request == "after the first finished":
        # The hung engine then holds the second request in its queue: 0 running, 1 waiting. The health
        # rule took that for idle, and the engine stayed ready (CI saw it when the suite's load spread the
        # two requests of the concurrent case apart).
        send_completion(deployment.port, key, max_tokens=4)
        threading.Thread(target=send_completion, args=(deployment.port, key), daemon=True).start()
    else:
        for _ in range(2):
            threading.Thread(target=send_completion, args=(deployment.port, key), daemon=True).start()

    # NODE_HANG_SECONDS after the last progress, then the kill (SIGTERM, up to 5 s, SIGKILL): about 3 s.
    deployment = tick_until(supervisor, deployment, in_state(DeploymentState.CRASHED), timeout=20)
    assert deployment.state_reason.startswith("Hung:")
    assert "no token progress" in deployment.state_reason
    deployment = tick_until(
        supervisor, deployment, lambda d: d.state == DeploymentState.READY and d.pid != hung_pid
    )
    supervisor.close()


def test_busy_engine_that_misses_probes_but_makes_tokens_stays_ready(
    host: Any, make_deployment: Any, node_settings: Any
) -> None:
    node_settings.NODE_HANG_SECONDS = 1.0
    deployment = make_deployment()
    supervisor = supervisor_for(host)
    supervisor.start()
    runtime.launch(deployment.pk)
    deployment = tick_until(supervisor, deployment, READY)

    # Probes time out (as under heavy load) while the token counters keep moving.
    tokens = 0.0
    for _ in range(8):
        tokens += 500
        busy = Observation(
            alive=True,
            health_ok=False,
            ready=False,
            metrics=EngineMetrics(num_requests_running=200, generation_tokens_total=tokens),
            error="TimeoutError: timed out",
        )
        supervisor.judge(deployment, busy, time.monotonic())
        deployment.refresh_from_db()
        assert deployment.state == DeploymentState.READY, deployment.state_reason
        time.sleep(0.3)

    # The same silence with frozen counters is a hang.
    frozen = Observation(
        alive=True,
        metrics=EngineMetrics(num_requests_running=200, generation_tokens_total=tokens),
        error="timeout",
    )
    deadline = time.monotonic() + 5
    while (
        deployment.state in (DeploymentState.READY, DeploymentState.DEGRADED) and time.monotonic() < deadline
    ):
        supervisor.judge(deployment, frozen, time.monotonic())
        deployment.refresh_from_db()
        time.sleep(0.3)
    assert deployment.state == DeploymentState.CRASHED
    assert "no token progress" in deployment.state_reason
    supervisor.close()
