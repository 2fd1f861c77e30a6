"""The fleet agent (`python -m nodes.agent`) as a real process with no database settings and Django
unusable: it launches a simulator engine, reports it ready, serves its log to the deployment page
(the web process never reads the file), survives its own restart, and stops the engine, all through
the agent channel of a live control plane."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nodes import agent_channel, process
from nodes.agent import remote
from nodes.agent_tokens import issue_agent_token
from nodes.choices import DeploymentState, HostState
from nodes.lifecycle import engine_api_key, live_deployment_key, mark_unreachable_hosts, read_live
from nodes.models import Deployment, Host
from tests.nodes.agent_channel import agent_env, kill, start_agent, wait_for

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_the_agent_imports_nothing_of_django() -> None:
    code = (
        "import sys, nodes.agent.remote, nodes.agent.__main__; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'rest_framework', 'psycopg')); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], env=agent_env("unused"), check=True, timeout=60)
    assert remote.AGENT_PYTHON == agent_channel.AGENT_PYTHON


def test_agent_without_database_launches_reports_serves_logs_and_stops(
    live_server: Any,
    host: Host,
    make_deployment: Callable[..., Deployment],
    admin_client: Any,
    tmp_path: Path,
    agents: list[subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
) -> None:
    token = issue_agent_token(host).raw_token
    deployment = make_deployment()
    engine_dir = tmp_path / "engines" / host.name
    log = tmp_path / "agent.log"
    agents.append(start_agent(host.name, live_server.url, token, engine_dir, log))

    def current() -> Deployment:
        return Deployment.objects.get(pk=deployment.pk)

    wait_for(lambda: current().state == DeploymentState.READY, 60, "ready", log)
    ready = current()
    assert ready.pid and process.is_alive(ready.pid)
    assert ready.log_path.startswith(str(engine_dir))
    assert Host.objects.get(pk=host.pk).agent_info["channel"] == "api"
    started = ready.events.filter(to_state=DeploymentState.STARTING).first()
    assert started is not None and started.launch is not None
    # The launch record names the agent's interpreter, never the engine key.
    assert started.launch["argv"][0] == sys.executable
    assert engine_api_key(ready) not in " ".join(started.launch["argv"])
    # Telemetry went through the channel into live state the proxy reads.
    wait_for(lambda: read_live(live_deployment_key(deployment.pk)) is not None, 10, "live state", log)

    # The deployment page's log: asked of the agent; this (web) process never opens the file.
    def no_disk(*args: Any, **kwargs: Any) -> str:
        raise AssertionError("the web process read an engine log from its own disk")

    monkeypatch.setattr(process, "tail", no_disk)
    response = admin_client.get(f"/api/deployments/{deployment.pk}/logs/", {"lines": 3})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["source"] == "agent"
    assert body["path"] == ready.log_path
    assert 0 < len(body["lines"]) <= 3
    download = admin_client.get(f"/api/deployments/{deployment.pk}/log-download/")
    assert download.status_code == 200
    assert download["Content-Disposition"] == f'attachment; filename="{deployment.name}.log"'
    assert body["lines"][-1] in download.content.decode()
    monkeypatch.undo()

    # The agent dies; the engine keeps serving; the next agent re-adopts it instead of launching twice.
    kill(agents[0])
    assert process.is_alive(ready.pid)
    agents.append(start_agent(host.name, live_server.url, token, engine_dir, log))
    wait_for(lambda: "re-adopted deployment" in log.read_text(), 30, "re-adoption", log)
    wait_for(lambda: "connected" in log.read_text().split("re-adopted")[-1], 30, "sync", log)
    assert current().pid == ready.pid
    assert current().state == DeploymentState.READY

    # The host missed heartbeats (beat's sweep, forced here): its engine is degraded; the agent's next
    # sync brings the host back and its next passing probe the engine.
    settings.NODE_UNREACHABLE_SECONDS = 0.0
    assert mark_unreachable_hosts() == [host.name]
    settings.NODE_UNREACHABLE_SECONDS = 60.0
    assert current().state == DeploymentState.DEGRADED
    wait_for(lambda: current().state == DeploymentState.READY, 30, "recovery", log)
    assert Host.objects.get(pk=host.pk).state == HostState.ONLINE
    assert current().events.filter(to_state=DeploymentState.READY, message__startswith="Recovered").exists()

    response = admin_client.post(f"/api/deployments/{deployment.pk}/stop/", {}, format="json")
    assert response.status_code == 202, response.content
    wait_for(lambda: current().state == DeploymentState.STOPPED, 30, "stopped", log)
    assert not process.is_alive(ready.pid)
    assert current().pid is None
