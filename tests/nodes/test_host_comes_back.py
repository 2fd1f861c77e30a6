"""A host that missed heartbeats comes back cleanly: its agent's next round puts the host online and
its still-running engines back to ready, without restarting them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from nodes.agent import runtime
from nodes.choices import DeploymentState, HostState
from nodes.lifecycle import mark_unreachable_hosts
from nodes.models import Host
from tests.nodes.conftest import READY, supervisor_for, tick_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_unreachable_host_and_degraded_engine_recover(host: Any, make_deployment: Any) -> None:
    deployment = make_deployment()
    supervisor = supervisor_for(host)
    supervisor.start()
    runtime.launch(deployment.pk)
    deployment = tick_until(supervisor, deployment, READY)
    pid = deployment.pid

    # The agent went quiet (network partition, paused VM): the sweep marks the host and its engine.
    Host.objects.filter(pk=host.pk).update(last_heartbeat=timezone.now() - timedelta(minutes=1))
    assert mark_unreachable_hosts() == [host.name]
    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.DEGRADED

    supervisor.last_heartbeat = 0.0  # its next round heartbeats at once
    deployment = tick_until(supervisor, deployment, READY)
    host.refresh_from_db()
    assert host.state == HostState.ONLINE
    assert deployment.pid == pid and deployment.restart_count == 0
    assert deployment.events.filter(message__startswith="Recovered").exists()
    supervisor.close()
