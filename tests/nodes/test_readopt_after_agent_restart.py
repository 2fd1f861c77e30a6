"""An agent restart re-adopts engines that still run instead of launching duplicates,
and treats engines that died meanwhile as crashes."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from nodes import process
from nodes.agent import runtime
from nodes.choices import DeploymentState
from nodes.models import Deployment
from tests.nodes.conftest import READY, in_state, supervisor_for, tick_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_running_engine_is_adopted_not_duplicated(host: Any, make_deployment: Any) -> None:
    deployment = make_deployment()
    first = supervisor_for(host)
    first.start()
    runtime.launch(deployment.pk)
    deployment = tick_until(first, deployment, READY)
    pid, token = deployment.pid, deployment.start_token
    assert pid is not None
    first.close()

    # A new agent process would start with an empty memory: only the row and the state file remain.
    second = supervisor_for(host)
    second.start()
    assert runtime.launch(deployment.pk) == "already running"
    for _ in range(3):
        second.tick()
    deployment.refresh_from_db()
    assert (deployment.pid, deployment.start_token, deployment.state) == (pid, token, DeploymentState.READY)
    assert process.is_alive(pid)
    second.close()


def test_engine_that_died_while_the_agent_was_away_is_restarted(host: Any, make_deployment: Any) -> None:
    deployment = make_deployment()
    first = supervisor_for(host)
    first.start()
    runtime.launch(deployment.pk)
    deployment = tick_until(first, deployment, READY)
    first.close()
    assert deployment.pid is not None
    os.killpg(deployment.pid, signal.SIGKILL)
    old_pid = deployment.pid
    # The engine died while the agent was away: wait for the kernel to finish the kill. killpg() only
    # queues SIGKILL; the process exits when it next runs, which on a loaded machine can be after the
    # second supervisor's adopt() (it then saw the pid alive and re-adopted it: 'ready', not 'crashed').
    deadline = time.monotonic() + 10
    while process.is_alive(old_pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not process.is_alive(old_pid)

    second = supervisor_for(host)
    second.start()  # adopt() finds the pid gone
    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.CRASHED
    assert "gone when the agent restarted" in deployment.state_reason
    deployment = tick_until(
        second, deployment, lambda d: d.state == DeploymentState.READY and d.pid != old_pid
    )
    second.close()


def test_reused_pid_is_not_mistaken_for_the_engine(host: Any, make_deployment: Any) -> None:
    # The row points at a live process that is not the engine (our own test process).
    deployment = make_deployment(pid=os.getpid(), start_token="abc", state=DeploymentState.READY)
    assert not runtime.engine_running(deployment)
    supervisor = supervisor_for(host)
    supervisor.start()
    deployment.refresh_from_db()
    assert deployment.state in (DeploymentState.CRASHED,)
    assert deployment.pid is None
    assert in_state(DeploymentState.CRASHED)(deployment)
    supervisor.close()


def test_engine_the_database_lost_is_stopped_before_relaunch(host: Any, make_deployment: Any) -> None:
    # The agent started the engine but failed before recording its pid (e.g. the database was locked).
    deployment = make_deployment()
    supervisor = supervisor_for(host)
    supervisor.start()
    runtime.launch(deployment.pk)
    deployment.refresh_from_db()
    orphan = deployment.pid
    assert orphan is not None
    Deployment.objects.filter(pk=deployment.pk).update(pid=None, state=DeploymentState.PENDING)

    assert runtime.launch(deployment.pk) == "started"  # not "port in use"
    deployment.refresh_from_db()
    assert deployment.pid != orphan and not process.is_alive(orphan)
    tick_until(supervisor, deployment, READY)
    supervisor.close()
