"""The agent channel's ingest (nodes/agent_ingest.py): routine syncs answered without Django or
PostgreSQL while the host's generation stands; every change, a revoked token, a bad or oversized body
goes the full path or is refused. The real ASGI app, PostgreSQL and Redis."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.core.asgi import get_asgi_application
from django.utils import timezone

from core.redis_client import get_redis
from nodes import agent_generation, history
from nodes.agent_ingest import AgentIngest, Leases
from nodes.agent_tokens import issue_agent_token, revoke_agent_tokens
from nodes.choices import DeploymentState, HostState
from nodes.lifecycle import live_deployment_key, transition
from nodes.models import Deployment, Host
from nodes.services import request_stop

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("redis_clean", "node_settings"),
]

INFO = {"version": "test", "simulated_gpus": True}


class Counting:
    """Django's ASGI app, counting the syncs that reached it (the full path)."""

    def __init__(self) -> None:
        self.app = get_asgi_application()
        self.calls = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls += 1
        await self.app(scope, receive, send)


def call(
    app: Any, body: bytes, token: str | None, receive: Callable[..., Any] | None = None
) -> tuple[int, Any]:
    """One POST /api/agent/sync/ through the ASGI app, in an event loop of its own; (status, JSON body)."""
    return asyncio.run(acall(app, body, token, receive))


async def acall(
    app: Any, body: bytes, token: str | None, receive: Callable[..., Any] | None = None
) -> tuple[int, Any]:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if token is not None:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/api/agent/sync/",
        "raw_path": b"/api/agent/sync/",
        "query_string": b"",
        "headers": headers,
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 5555),
        "scheme": "http",
        "http_version": "1.1",
        "asgi": {"version": "3.0"},
    }
    sent = False

    async def whole() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    out: dict[str, Any] = {"body": b""}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
        else:
            out["body"] += message.get("body", b"")

    await app(scope, receive or whole, send)
    return out["status"], json.loads(out["body"])


def batch(host: str, deployment: Deployment, generation: int | None, **extra: Any) -> bytes:
    now = time.time()
    return json.dumps(
        {
            "host": host,
            "info": INFO,
            "gpus": [{"index": 0, "ts": now, "utilization_pct": 41.0, "memory_used_bytes": 1}],
            "engines": [{"deployment_id": deployment.pk, "ts": now, "tokens_per_s": 12.5}],
            "generation": generation,
            **extra,
        }
    ).encode()


@pytest.fixture
def ready(make_deployment: Callable[..., Deployment], host: Host) -> tuple[Deployment, str]:
    deployment = make_deployment(state=DeploymentState.READY, start_token="tok1", pid=4242)
    Host.objects.filter(pk=host.pk).update(agent_info={**INFO, "channel": "api"})
    return deployment, issue_agent_token(host).raw_token


def test_a_routine_sync_skips_django_and_writes_only_redis(ready: tuple[Deployment, str], host: Host) -> None:
    deployment, token = ready
    app = Counting()
    ingest = AgentIngest(app)
    status, first = call(ingest, batch(host.name, deployment, None), token)
    assert status == 200 and app.calls == 1 and not first.get("unchanged")
    assert [d["id"] for d in first["deployments"]] == [deployment.pk]
    generation = first["generation"]
    get_redis().delete(live_deployment_key(deployment.pk))

    status, second = call(ingest, batch(host.name, deployment, generation), token)
    assert status == 200 and second == {"acked": [], "generation": generation, "unchanged": True}
    assert app.calls == 1 and ingest.answered == 1  # Django never saw it
    raw = get_redis().get(live_deployment_key(deployment.pk))
    assert raw is not None
    live = json.loads(raw)
    assert live["tokens_per_s"] == 12.5 and live["state"] == "ready" and live["host"] == host.name
    assert 0 < get_redis().ttl(live_deployment_key(deployment.pk)) <= 5
    # The hour of history got one entry per sync, for the engine and the GPU; the full sync set its expiry.
    for series in (history.engine_series_key(deployment.pk), history.gpu_series_key(host.name, 0)):
        assert get_redis().xlen(series) == 2 and 3000 < get_redis().ttl(series) <= 3600
    gpus, engines = history.read([(host.name, 0)], [deployment.pk], minutes=1)
    assert engines[deployment.pk].values["tokens_per_s"] == [12.5, 12.5]
    assert gpus[(host.name, 0)].values["utilization_pct"] == [41.0, 41.0]


def test_a_change_moves_the_generation_and_the_next_sync_is_told(
    ready: tuple[Deployment, str], host: Host
) -> None:
    deployment, token = ready
    app = Counting()
    ingest = AgentIngest(app)
    generation = call(ingest, batch(host.name, deployment, None), token)[1]["generation"]
    request_stop(Deployment.objects.get(pk=deployment.pk))  # an admin's stop: a write of ours

    status, told = call(ingest, batch(host.name, deployment, generation), token)
    assert status == 200 and app.calls == 2 and not told.get("unchanged")
    assert told["generation"] > generation
    assert (
        told["deployments"][0]["desired_state"] == "stopped" and told["deployments"][0]["state"] == "stopping"
    )
    # A transition alone (no desired-state write) moves it too: the agent must see the new state.
    generation = told["generation"]
    transition(Deployment.objects.get(pk=deployment.pk), DeploymentState.STOPPED, "gone", pid=None)
    status, again = call(ingest, batch(host.name, deployment, generation), token)
    assert app.calls == 3 and again["deployments"][0]["state"] == "stopped"


def test_queued_changes_and_new_inventory_go_the_full_path(ready: tuple[Deployment, str], host: Host) -> None:
    deployment, token = ready
    app = Counting()
    ingest = AgentIngest(app)
    generation = call(ingest, batch(host.name, deployment, None), token)[1]["generation"]
    change = {"id": "c1", "kind": "degraded", "deployment_id": deployment.pk, "start_token": "tok1"}
    status, answer = call(ingest, batch(host.name, deployment, generation, changes=[change]), token)
    assert status == 200 and answer["acked"] == ["c1"] and app.calls == 2
    assert Deployment.objects.get(pk=deployment.pk).state == DeploymentState.DEGRADED
    # Replayed (the agent never got the answer): applied once, acknowledged again.
    status, answer = call(ingest, batch(host.name, deployment, answer["generation"], changes=[change]), token)
    assert answer["acked"] == ["c1"] and deployment.events.filter(to_state="degraded").count() == 1


def test_a_revoked_or_wrong_token_is_refused_at_once(ready: tuple[Deployment, str], host: Host) -> None:
    deployment, token = ready
    ingest = AgentIngest(Counting())
    generation = call(ingest, batch(host.name, deployment, None), token)[1]["generation"]
    other = Host.objects.create(name="node-b", state=HostState.ONLINE, last_heartbeat=timezone.now())
    stranger = issue_agent_token(other).raw_token
    status, refused = call(ingest, batch(host.name, deployment, generation), stranger)
    assert status == 403 and refused["error"]["code"] == "agent_token_wrong_host"

    revoke_agent_tokens(host, actor=None)
    status, refused = call(ingest, batch(host.name, deployment, generation), token)
    assert status == 401 and refused["error"]["code"] == "agent_token_revoked"
    assert ingest.answered == 0


def test_bad_input_is_refused_naming_what_and_applies_nothing(
    ready: tuple[Deployment, str], host: Host, settings: Any
) -> None:
    deployment, token = ready
    ingest = AgentIngest(Counting())
    generation = call(ingest, batch(host.name, deployment, None), token)[1]["generation"]
    get_redis().delete(live_deployment_key(deployment.pk))

    settings.AGENT_SYNC_MAX_BYTES = 2000
    status, too_big = call(ingest, batch(host.name, deployment, generation, pad="x" * 3000), token)
    assert (
        status == 413
        and too_big["error"]["code"] == "sync_too_large"
        and "2000 bytes" in too_big["error"]["message"]
    )
    settings.AGENT_SYNC_MAX_BYTES = 4 * 1024 * 1024

    status, wrong = call(ingest, batch(host.name, deployment, generation, gpus="all of them"), token)
    assert status == 400 and "gpus" in wrong
    status, unknown = call(ingest, batch(host.name, deployment, generation, extra_field=1), token)
    assert status == 400 and "extra_field" in json.dumps(unknown)
    assert get_redis().get(live_deployment_key(deployment.pk)) is None and ingest.answered == 0


def test_a_slow_body_is_cut_off(ready: tuple[Deployment, str], host: Host, settings: Any) -> None:
    _, token = ready
    settings.AGENT_SYNC_BODY_SECONDS = 0.2

    async def trickle() -> dict[str, Any]:
        await asyncio.sleep(0.05)
        return {"type": "http.request", "body": b" ", "more_body": True}

    began = time.monotonic()
    status, slow = call(AgentIngest(Counting()), b"{}", token, receive=trickle)
    assert status == 408 and slow["error"]["code"] == "sync_body_timeout"
    assert time.monotonic() - began < 2


def test_a_snapshot_falls_due_for_a_crashed_engines_restart(
    make_deployment: Callable[..., Deployment], host: Host
) -> None:
    crashed = make_deployment(
        state=DeploymentState.CRASHED, next_restart_at=timezone.now() + timedelta(seconds=1), start_token="t"
    )
    token = issue_agent_token(host).raw_token
    app = Counting()
    ingest = AgentIngest(app)
    generation = call(ingest, batch(host.name, crashed, None), token)[1]["generation"]
    assert call(ingest, batch(host.name, crashed, generation), token)[1].get("unchanged")
    time.sleep(1.1)  # the backoff is over: the full path must relaunch it
    status, due = call(ingest, batch(host.name, crashed, generation), token)
    assert status == 200 and not due.get("unchanged") and app.calls == 2
    assert Deployment.objects.get(pk=crashed.pk).state == DeploymentState.VERIFYING


def test_leases_write_heartbeats_in_one_update_and_never_revive_an_unreachable_host(
    host: Host, settings: Any
) -> None:
    settings.NODE_HEARTBEAT_SECONDS = 0.1
    down = Host.objects.create(name="node-down", state=HostState.UNREACHABLE, last_heartbeat=timezone.now())
    old = timezone.now() - timedelta(seconds=30)
    Host.objects.filter(pk__in=[host.pk, down.pk]).update(last_heartbeat=old)

    async def run() -> None:
        leases = Leases()
        leases.saw(host.name, old.timestamp())
        leases.saw(down.name, old.timestamp())
        await leases.flush()
        leases.task.cancel() if leases.task else None

    asyncio.run(run())
    leased = Host.objects.get(pk=host.pk).last_heartbeat
    assert leased is not None and leased > old + timedelta(seconds=25)
    unchanged = Host.objects.get(pk=down.pk)
    assert unchanged.last_heartbeat == old and unchanged.state == HostState.UNREACHABLE


def test_hosts_in_a_multi_host_deployment_get_no_snapshot(ready: tuple[Deployment, str], host: Host) -> None:
    from nodes.models import DeploymentMember

    deployment, token = ready
    member = Host.objects.create(name="node-m", state=HostState.ONLINE, last_heartbeat=timezone.now())
    DeploymentMember.objects.create(deployment=deployment, host=member, stage=1, gpu_indices=[0])
    app = Counting()
    ingest = AgentIngest(app)
    generation = call(ingest, batch(host.name, deployment, None), token)[1]["generation"]
    assert get_redis().get(agent_generation.snapshot_key(host.name)) is None
    call(ingest, batch(host.name, deployment, generation), token)
    assert app.calls == 2 and ingest.answered == 0


def test_bulk_writes_move_the_generation_but_heartbeats_do_not(
    ready: tuple[Deployment, str], host: Host
) -> None:
    from nodes.agent.services import record_heartbeat
    from nodes.lifecycle import mark_unreachable_hosts

    deployment, _ = ready
    start = agent_generation.current(host.name)
    record_heartbeat(host.name, {**INFO, "channel": "api"})  # a heartbeat alone: nothing to tell
    Host.objects.filter(pk=host.pk).update(last_heartbeat=timezone.now())
    assert agent_generation.current(host.name) == start
    Deployment.objects.filter(pk=deployment.pk).update(desired_state="stopped")  # no signal for this
    assert agent_generation.current(host.name) == start + 1
    Host.objects.filter(pk=host.pk).update(last_heartbeat=timezone.now() - timedelta(minutes=5))
    assert mark_unreachable_hosts() == [host.name]  # the sweep's bulk state write
    assert agent_generation.current(host.name) > start + 1


def test_a_log_request_reaches_the_agent_at_its_next_sync(ready: tuple[Deployment, str], host: Host) -> None:
    from nodes import agent_channel

    deployment, token = ready
    app = Counting()
    ingest = AgentIngest(app)
    generation = call(ingest, batch(host.name, deployment, None), token)[1]["generation"]
    # Nobody answers it here (the agent is this test): it waits a second and gives up, still queued.
    assert agent_channel.request_log(deployment, lines=5, max_bytes=100, timeout=0.01) is None
    status, told = call(ingest, batch(host.name, deployment, generation), token)
    assert (
        status == 200
        and app.calls == 2
        and [r["deployment_id"] for r in told["log_requests"]] == [deployment.pk]
    )


def test_live_events_reach_the_groups_someone_listens_to(ready: tuple[Deployment, str], host: Host) -> None:
    from channels.layers import get_channel_layer

    from core.live import FLEET_GROUP, deployment_group

    deployment, token = ready
    ingest = AgentIngest(Counting())
    generation = call(ingest, batch(host.name, deployment, None), token)[1]["generation"]

    async def run() -> dict[str, Any]:
        layer = get_channel_layer()
        browser = await layer.new_channel()
        await layer.group_add(FLEET_GROUP, browser)
        try:
            status, answer = await acall(ingest, batch(host.name, deployment, generation), token)
            assert status == 200 and answer.get("unchanged")
            return await asyncio.wait_for(layer.receive(browser), 5)
        finally:
            await layer.group_discard(FLEET_GROUP, browser)

    event = asyncio.run(run())["event"]
    assert event["type"] == "host.telemetry" and event["host"] == host.name
    assert [e["deployment_id"] for e in event["engines"]] == [deployment.pk]
    assert ingest.answered == 1
    # Nobody is in the deployment's own group: no event was queued for it (the send was skipped).
    assert get_redis().zcard(group_key_of(deployment_group(deployment.pk))) == 0


def group_key_of(group: str) -> str:
    from core.live import group_key

    found = group_key(group)
    assert found is not None
    return found
