"""An agent that loses the control plane keeps its engines serving and queues what it sees; an engine that
dies meanwhile is started again by the agent itself, as it was launched, after the control plane's
backoff; when the control plane answers again, the queue is replayed once and the control plane catches
up (here: the engine died during the outage -> the agent restarted it -> crash and restart recorded ->
ready, the same launch and start token throughout)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nodes import process
from nodes.agent_tokens import issue_agent_token
from nodes.choices import DeploymentState
from nodes.models import Deployment, Host
from nodes.probes import http_get
from tests.nodes.agent_channel import Relay, kill, start_agent, wait_for

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def relay(live_server: Any) -> Iterator[Relay]:
    address, port = live_server.url.removeprefix("http://").split(":")
    forwarder = Relay(address, int(port))
    yield forwarder
    forwarder.close()


def test_engines_serve_through_an_outage_and_the_queue_catches_up(
    relay: Relay,
    host: Host,
    make_deployment: Callable[..., Deployment],
    tmp_path: Path,
) -> None:
    token = issue_agent_token(host).raw_token
    deployment = make_deployment()
    engine_dir = tmp_path / "engines" / host.name
    log = tmp_path / "agent.log"
    agent = start_agent(host.name, f"http://127.0.0.1:{relay.port}", token, engine_dir, log)
    try:
        _outage(relay, deployment, engine_dir, log)
    finally:
        kill(agent)


def _outage(relay: Relay, deployment: Deployment, engine_dir: Path, log: Path) -> None:
    def current() -> Deployment:
        return Deployment.objects.get(pk=deployment.pk)

    wait_for(lambda: current().state == DeploymentState.READY, 60, "ready", log)
    first = current()
    assert first.pid is not None
    events_before = first.events.count()

    relay.cut()
    wait_for(lambda: "control plane unreachable" in log.read_text(), 15, "the agent to notice", log)
    # The engine keeps serving while its agent cannot reach the control plane.
    for _ in range(3):
        assert http_get("127.0.0.1", first.port, "/health", timeout=2.0).ok
    # It dies during the outage: the agent queues the exit (on disk); the control plane hears nothing yet.
    os.killpg(first.pid, signal.SIGKILL)
    outbox = engine_dir / "agent-outbox.json"

    def queued_kinds() -> list[str]:
        try:
            return [c["kind"] for c in json.loads(outbox.read_text())]
        except (OSError, ValueError):
            return []

    wait_for(lambda: "exited" in queued_kinds(), 15, "the exit to be queued", log)
    # The agent starts it again on its own (the control plane's backoff, 2 s by default), with the same
    # command line and start token, so the engine key and the proxies' routes still hold.
    wait_for(lambda: "relaunched" in queued_kinds(), 20, "the agent's own restart", log)
    record = process.EngineRecord(**json.loads((engine_dir / f"deployment-{deployment.pk}.json").read_text()))
    assert record.pid != first.pid and record.start_token == first.start_token
    wait_for(
        lambda: http_get("127.0.0.1", first.port, "/health", timeout=2.0).ok,
        30,
        "serving again, still away",
        log,
    )
    # Judged ready by the agent too, and queued after the restart.
    wait_for(
        lambda: "ready" in queued_kinds()[queued_kinds().index("relaunched") :], 30, "ready, queued", log
    )
    assert current().state == DeploymentState.READY and current().pid == first.pid
    assert current().events.count() == events_before  # the control plane has heard nothing yet

    relay.restore()
    wait_for(lambda: current().restarts_total == 1, 30, "the crash to be recorded", log)
    wait_for(
        lambda: current().state == DeploymentState.READY and current().pid == record.pid,
        60,
        "the agent's restart recorded",
        log,
    )
    again = current()
    assert again.start_token == first.start_token, "the control plane launched again instead"
    assert process.is_alive(record.pid)
    crashes = again.events.filter(to_state=DeploymentState.CRASHED)
    assert crashes.count() == 1, list(again.events.values_list("to_state", "message"))
    assert "The engine exited" in crashes.get().message
    restarted = again.events.filter(to_state=DeploymentState.STARTING).order_by("-at", "-id").first()
    assert restarted is not None
    assert restarted.message.startswith(
        f"Restarted on {deployment.host.name} by its agent while the control plane"
    )
    wait_for(lambda: queued_kinds() == [], 10, "the queue to drain", log)


def test_a_replayed_batch_changes_nothing_twice(
    host: Host, make_deployment: Callable[..., Deployment], client: Any
) -> None:
    """The agent resends a batch whose answer it lost: the second delivery applies nothing."""
    token = issue_agent_token(host).raw_token
    deployment = make_deployment()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}

    def sync(changes: list[dict[str, Any]]) -> dict[str, Any]:
        response = client.post(
            "/api/agent/sync/",
            {"host": host.name, "changes": changes},
            content_type="application/json",
            **auth,
        )
        assert response.status_code == 200, response.content
        return dict(response.json())

    answer = sync([])  # the launch is prepared: a start token and a command line for the agent
    (described,) = [d for d in answer["deployments"] if d["id"] == deployment.pk]
    assert described["launch"] is not None and described["start_token"]
    token_of_launch = described["start_token"]
    started = {
        "id": "c1",
        "kind": "started",
        "deployment_id": deployment.pk,
        "start_token": token_of_launch,
        "pid": 4242,
        "log_path": "/var/engines/x.log",
    }
    ready = {"id": "c2", "kind": "ready", "deployment_id": deployment.pk, "start_token": token_of_launch}
    assert sync([started, ready])["acked"] == ["c1", "c2"]
    deployment.refresh_from_db()
    assert (deployment.state, deployment.pid) == (DeploymentState.READY, 4242)
    events = deployment.events.count()

    assert sync([started, ready])["acked"] == ["c1", "c2"]
    deployment.refresh_from_db()
    assert (deployment.state, deployment.pid) == (DeploymentState.READY, 4242)
    assert deployment.events.count() == events
    # An exit of an engine of an earlier launch (another start token) is stale: ignored.
    stale = {
        "id": "c3",
        "kind": "exited",
        "deployment_id": deployment.pk,
        "start_token": "old",
        "message": "x",
    }
    sync([stale])
    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.READY
