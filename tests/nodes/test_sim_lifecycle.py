"""A simulated engine through the agent's own code: deploy -> ready -> crash -> auto-restart -> stop."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from core.redis_client import get_redis
from nodes import process
from nodes.agent import runtime
from nodes.choices import DeploymentState, DesiredState
from nodes.lifecycle import engine_api_key, live_deployment_key
from nodes.probes import http_get
from tests.nodes.conftest import READY, in_state, supervisor_for, tick_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_deploy_ready_crash_restart_stop(host: Any, make_deployment: Any) -> None:
    deployment = make_deployment()
    supervisor = supervisor_for(host)
    supervisor.start()

    assert runtime.launch(deployment.pk) == "started"
    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.STARTING
    first_pid = deployment.pid
    assert first_pid and process.is_alive(first_pid)

    deployment = tick_until(supervisor, deployment, READY)
    supervisor.tick()
    assert get_redis().get(live_deployment_key(deployment.pk)) is not None
    models = http_get(
        "127.0.0.1", deployment.port, "/v1/models", timeout=2, api_key=engine_api_key(deployment)
    )
    assert b"llama-3.1-8b" in models.body

    # Crash: the engine dies under the agent's feet.
    os.killpg(first_pid, signal.SIGKILL)
    deployment = tick_until(supervisor, deployment, in_state(DeploymentState.CRASHED))
    assert deployment.restart_count == 1 and deployment.restarts_total == 1
    assert "exited" in deployment.state_reason
    # The proxy's live view forgets a crashed engine at once, not after the key's TTL.
    assert get_redis().get(live_deployment_key(deployment.pk)) is None

    # Backoff elapses, the supervisor relaunches with a new pid and a new start token (new key).
    old_key = engine_api_key(deployment)
    deployment = tick_until(
        supervisor, deployment, lambda d: d.state == DeploymentState.READY and d.pid != first_pid
    )
    assert engine_api_key(deployment) != old_key
    assert http_get("127.0.0.1", deployment.port, "/v1/models", timeout=2, api_key=old_key).status == 401

    # Stop: graceful, the process is gone and the state says so.
    second_pid = deployment.pid
    deployment.desired_state = DesiredState.STOPPED
    deployment.save(update_fields=["desired_state"])
    assert runtime.stop(deployment.pk) == "stopped"
    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.STOPPED and deployment.pid is None
    assert second_pid and not process.is_alive(second_pid)
    states = list(deployment.events.order_by("at", "id").values_list("to_state", flat=True))
    for expected in ("starting", "ready", "crashed", "ready", "stopping", "stopped"):
        assert expected in states
    supervisor.close()
