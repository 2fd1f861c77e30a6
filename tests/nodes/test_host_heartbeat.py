"""Heartbeats: a silent host becomes unreachable within the stated bound and comes back cleanly."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.utils import timezone

from core.live import FLEET_GROUP, deployment_group, host_group
from nodes import agent_generation, lifecycle
from nodes.agent.services import record_heartbeat
from nodes.choices import DeploymentState, HostState
from nodes.lifecycle import host_is_reachable, mark_unreachable_hosts
from nodes.models import Deployment, DeploymentEvent, Host
from nodes.tasks import check_host_heartbeats
from tests.nodes.conftest import make_host

pytestmark = pytest.mark.django_db


def test_silent_host_becomes_unreachable_and_its_engines_degraded(
    host: Any, make_deployment: Any, node_settings: Any
) -> None:
    ready = make_deployment(state=DeploymentState.READY)
    bound = settings.NODE_UNREACHABLE_SECONDS
    host.last_heartbeat = timezone.now() - timedelta(seconds=bound - 1)
    host.save()
    assert mark_unreachable_hosts() == []
    assert host_is_reachable(host)

    Host.objects.filter(pk=host.pk).update(last_heartbeat=timezone.now() - timedelta(seconds=bound + 1))
    assert check_host_heartbeats() == [host.name]
    host.refresh_from_db()
    ready.refresh_from_db()
    assert host.state == HostState.UNREACHABLE and not host_is_reachable(host)
    assert ready.state == DeploymentState.DEGRADED and "missed heartbeats" in ready.state_reason
    # Idempotent: a second sweep changes nothing.
    assert mark_unreachable_hosts() == []


def test_heartbeat_brings_the_host_back(host: Any) -> None:
    Host.objects.filter(pk=host.pk).update(
        state=HostState.UNREACHABLE, last_heartbeat=timezone.now() - timedelta(minutes=1)
    )
    record_heartbeat(host.name, {"pid": 1})
    host.refresh_from_db()
    assert host.state == HostState.ONLINE and host_is_reachable(host)
    assert host.agent_info == {"pid": 1}


def test_reachability_is_computed_from_the_timestamp_not_a_stale_flag(host: Any, node_settings: Any) -> None:
    # Even if beat is down and nobody swept, an old heartbeat reads as unreachable.
    Host.objects.filter(pk=host.pk).update(
        state=HostState.ONLINE,
        last_heartbeat=timezone.now() - timedelta(seconds=settings.NODE_UNREACHABLE_SECONDS + 1),
    )
    host.refresh_from_db()
    assert not host_is_reachable(host)


def test_one_sweep_marks_every_silent_host_and_does_for_each_engine_what_a_transition_does(
    host: Any,
    make_deployment: Any,
    node_settings: Any,
    redis_clean: None,
    monkeypatch: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    bound = settings.NODE_UNREACHABLE_SECONDS
    second, fresh, never, gone = (make_host(name) for name in ("node-b", "node-c", "node-d", "node-e"))
    ready = make_deployment(state=DeploymentState.READY)
    starting = make_deployment(state=DeploymentState.STARTING)
    crashed = make_deployment(state=DeploymentState.CRASHED)
    on_second = make_deployment(host=second, state=DeploymentState.READY)
    on_fresh = make_deployment(host=fresh, state=DeploymentState.READY)
    on_gone = make_deployment(host=gone, state=DeploymentState.READY)
    seen = {
        host.name: timezone.now() - timedelta(seconds=bound + 30),
        second.name: timezone.now() - timedelta(seconds=bound + 1),
    }
    for name, at in seen.items():
        Host.objects.filter(name=name).update(last_heartbeat=at)
    long_ago = timezone.now() - timedelta(minutes=5)
    Host.objects.filter(pk=never.pk).update(state=HostState.UNKNOWN, last_heartbeat=long_ago)
    Host.objects.filter(pk=gone.pk).update(state=HostState.UNREACHABLE, last_heartbeat=long_ago)
    generations = {name: agent_generation.current(name) for name in seen}
    published: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(lifecycle, "publish_config_change", lambda kind, **p: published.append((kind, p)))
    pushed: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(lifecycle, "push_events_to_listeners", pushed.extend)

    with django_capture_on_commit_callbacks(execute=True):
        assert mark_unreachable_hosts() == [host.name, second.name]

    states = dict(Host.objects.values_list("name", "state"))
    assert states == {
        host.name: HostState.UNREACHABLE,
        second.name: HostState.UNREACHABLE,
        fresh.name: HostState.ONLINE,
        never.name: HostState.UNKNOWN,
        gone.name: HostState.UNREACHABLE,
    }
    reason = {
        name: f"Host {name} missed heartbeats (last {at.isoformat()}); engine state unknown."
        for name, at in seen.items()
    }
    expected = {
        ready.pk: (DeploymentState.DEGRADED, reason[host.name]),
        starting.pk: (DeploymentState.DEGRADED, reason[host.name]),
        on_second.pk: (DeploymentState.DEGRADED, reason[second.name]),
        crashed.pk: (DeploymentState.CRASHED, ""),
        on_fresh.pk: (DeploymentState.READY, ""),
        on_gone.pk: (DeploymentState.READY, ""),
    }
    for pk, (state, why) in expected.items():
        dep = Deployment.objects.get(pk=pk)
        assert (dep.state, dep.state_reason) == (state, why), dep.name
        if state == DeploymentState.DEGRADED:
            assert dep.state_changed_at is not None
    events = sorted(DeploymentEvent.objects.values_list("deployment_id", "from_state", "to_state", "message"))
    assert events == sorted(
        [
            (ready.pk, DeploymentState.READY, DeploymentState.DEGRADED, reason[host.name]),
            (starting.pk, DeploymentState.STARTING, DeploymentState.DEGRADED, reason[host.name]),
            (on_second.pk, DeploymentState.READY, DeploymentState.DEGRADED, reason[second.name]),
        ]
    )
    # The proxies hear of each host and engine; the agents' next syncs are full ones.
    assert sorted(published, key=repr) == sorted(
        [("host", {"name": name, "state": HostState.UNREACHABLE}) for name in seen]
        + [
            ("deployment", {"id": pk, "state": DeploymentState.DEGRADED})
            for pk in (ready.pk, starting.pk, on_second.pk)
        ],
        key=repr,
    )
    assert all(agent_generation.current(name) > generations[name] for name in seen)
    # Browsers: each engine's change to the fleet, its host's and its own group, then its host's change
    # to the fleet and the host's group, host after host.
    got = [(group, event["type"], event.get("deployment_id") or event["host"]) for group, event in pushed]
    for name, engines in ((host.name, {ready.pk, starting.pk}), (second.name, {on_second.pk})):
        mine = [g for g in got if g[2] in engines or g[2] == name]
        assert {(g[0], g[2]) for g in mine if g[1] == "deployment.state"} == {
            (group, pk) for pk in engines for group in (FLEET_GROUP, host_group(name), deployment_group(pk))
        }
        assert mine[-2:] == [(FLEET_GROUP, "host.state", name), (host_group(name), "host.state", name)]
    assert [g[2] for g in got].index(second.name) > max(
        i for i, g in enumerate(got) if g[2] in (ready.pk, starting.pk)
    )
    degraded = next(e for g, e in pushed if e.get("deployment_id") == ready.pk)
    assert degraded["from_state"] == DeploymentState.READY and degraded["reason"] == reason[host.name]


def test_live_pushes_skip_the_groups_nobody_listens_to_and_keep_their_order(
    db: None, redis_clean: None, monkeypatch: Any
) -> None:
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(FLEET_GROUP, channel)
    sent: list[str] = []
    group_send = layer.group_send

    async def spy(group: str, message: dict[str, Any]) -> None:
        sent.append(group)
        await group_send(group, message)

    monkeypatch.setattr(layer, "group_send", spy)
    events = [{"type": "deployment.state", "deployment_id": i} for i in range(3)]
    lifecycle.push_events_to_listeners(
        [
            (FLEET_GROUP, events[0]),
            (host_group("node-a"), events[0]),
            (FLEET_GROUP, events[1]),
            (deployment_group(2), events[2]),
            (FLEET_GROUP, events[2]),
        ]
    )
    assert sent == [FLEET_GROUP] * 3

    async def receive_three() -> list[dict[str, Any]]:
        return [(await layer.receive(channel))["event"] for _ in range(3)]

    assert async_to_sync(receive_three)() == events
