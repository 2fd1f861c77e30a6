"""Heartbeats: a silent host becomes unreachable within the stated bound and comes back cleanly."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from nodes.agent.services import record_heartbeat
from nodes.choices import DeploymentState, HostState
from nodes.lifecycle import host_is_reachable, mark_unreachable_hosts
from nodes.models import Host
from nodes.tasks import check_host_heartbeats

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
