"""Drain: the engine is stopped only after its in-flight requests have finished."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from typing import Any

import pytest

from nodes import process
from nodes.agent import runtime
from nodes.choices import DeploymentState
from nodes.lifecycle import engine_api_key
from nodes.services import request_stop
from tests.nodes.conftest import READY, supervisor_for, tick_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_drain_waits_for_in_flight_requests(host: Any, make_deployment: Any) -> None:
    # Real-time simulation: a 400-token answer takes a few seconds on the modelled H100.
    deployment = make_deployment(extra_args=["--sim-time-scale", "1"])
    supervisor = supervisor_for(host)
    supervisor.start()
    runtime.launch(deployment.pk)
    deployment = tick_until(supervisor, deployment, READY)
    pid = deployment.pid
    assert pid is not None

    result: dict[str, Any] = {}

    def long_request() -> None:
        body = json.dumps(
            {"model": "llama-3.1-8b", "prompt": "tell a story", "max_tokens": 400, "ignore_eos": True}
        ).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{deployment.port}/v1/completions",
            data=body,
            headers={
                "Authorization": f"Bearer {engine_api_key(deployment)}",
                "Content-Type": "application/json",
            },
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            result["status"] = response.status
            result["tokens"] = json.loads(response.read())["usage"]["completion_tokens"]
            result["finished_at"] = time.monotonic()

    client = threading.Thread(target=long_request)
    client.start()
    time.sleep(0.5)  # the request is running now
    request_stop(deployment, drain=True)
    drain_began = time.monotonic()
    assert runtime.stop(deployment.pk, drain=True) == "stopped"
    stopped_at = time.monotonic()
    client.join(30)

    assert result["status"] == 200 and result["tokens"] == 400
    # The request was still running when the drain began, and finished before the engine stopped.
    assert drain_began < result["finished_at"] <= stopped_at
    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.STOPPED and not process.is_alive(pid)
    supervisor.close()
