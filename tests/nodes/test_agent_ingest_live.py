"""A real fleet agent against the real web process (uvicorn, inferchain.asgi, as `make run` starts it):
its routine syncs go through the ingest, and what an admin changes still reaches it, through the
generation it echoes. Real PostgreSQL and Redis; the engine is the simulator."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from core.redis_client import get_redis
from nodes import agent_generation, process
from nodes.agent_tokens import issue_agent_token, revoke_agent_tokens
from nodes.choices import DeploymentState
from nodes.lifecycle import live_deployment_key
from nodes.models import Deployment, Host
from nodes.services import request_stop
from tests.e2e.harness import start_console
from tests.nodes.agent_channel import start_agent, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_clean")]


def test_a_real_agent_syncs_through_the_ingest_and_still_hears_a_stop(
    host: Host,
    make_deployment: Callable[..., Deployment],
    node_settings: Any,
    tmp_path: Path,
    agents: list[subprocess.Popen[bytes]],
) -> None:
    console = start_console(
        tmp_path,
        {
            "ENGINE_LOG_DIR": str(node_settings.ENGINE_LOG_DIR),
            "MODEL_ROOTS": ",".join(str(p) for p in node_settings.MODEL_ROOTS),
            "NODE_TELEMETRY_SECONDS": "0.3",
            "NODE_HEARTBEAT_SECONDS": "1",
            "NODE_STARTUP_TIMEOUT_SECONDS": "30",
            "NODE_STOP_TIMEOUT_SECONDS": "5",
        },
    )
    try:
        token = issue_agent_token(host).raw_token
        deployment = make_deployment()
        log = tmp_path / "agent.log"
        agents.append(start_agent(host.name, console.url, token, tmp_path / "engines" / host.name, log))

        def current() -> Deployment:
            return Deployment.objects.get(pk=deployment.pk)

        wait_for(lambda: current().state == DeploymentState.READY, 60, "ready", log)
        # Settled: the snapshot stands for the current generation, so the agent's syncs are routine ones.
        wait_for(lambda: _snapshot_current(host.name), 10, "a standing sync snapshot", log)
        generation = agent_generation.current(host.name)
        first = _live_ts(deployment.pk)
        heartbeat = Host.objects.get(pk=host.pk).last_heartbeat
        time.sleep(2.5)
        assert agent_generation.current(host.name) == generation  # nothing was written to the host's rows
        assert _live_ts(deployment.pk) > first + 1.5  # telemetry kept flowing
        leased = Host.objects.get(pk=host.pk).last_heartbeat
        assert heartbeat is not None and leased is not None and leased > heartbeat  # the lease moved

        # An admin's stop moves the generation: the agent's next sync is a full one, and it stops.
        pid = current().pid
        request_stop(current())
        wait_for(lambda: current().state == DeploymentState.STOPPED, 20, "stopped", log)
        assert pid is not None and not process.is_alive(pid)

        # A revoked token is refused at the agent's next sync, routine or not.
        wait_for(lambda: _snapshot_current(host.name), 10, "a standing sync snapshot", log)
        revoke_agent_tokens(host)
        wait_for(lambda: "refused this agent's token" in log.read_text(), 10, "the refusal", log)
    finally:
        console.stop()


def _snapshot_current(host_name: str) -> bool:
    raw = get_redis().get(agent_generation.snapshot_key(host_name))
    return raw is not None and json.loads(raw)["generation"] == agent_generation.current(host_name)


def _live_ts(deployment_id: int) -> float:
    raw = get_redis().get(live_deployment_key(deployment_id))
    return float(json.loads(raw)["ts"]) if raw else 0.0
