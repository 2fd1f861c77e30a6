"""`make stop` (manage.py stop_engines) while the agent runs: the engine stays stopped, and the next
`make run` (its seed) starts it again."""

from __future__ import annotations

from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from nodes import process
from nodes.agent import runtime
from nodes.choices import DeploymentState, DesiredState
from nodes.demo import STOPPED_BY_MAKE_STOP, start_what_make_stop_stopped
from tests.nodes.conftest import READY, supervisor_for, tick_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_agent_does_not_relaunch_what_make_stop_stopped(
    host: Any, make_deployment: Any, node_settings: Any
) -> None:
    deployment = make_deployment()
    agent = supervisor_for(host)
    agent.start()
    try:
        runtime.launch(deployment.pk)
        deployment = tick_until(agent, deployment, READY)
        pid = deployment.pid
        assert pid is not None

        out = StringIO()
        call_command("stop_engines", "--timeout", "5", stdout=out)
        assert f"stopped 1 engine(s): deployments [{deployment.pk}]" in out.getvalue()
        assert not process.is_alive(pid)

        # Before the fix the agent saw a dead engine that should run and relaunched it after the
        # restart backoff (0.2 s here): far fewer ticks than these.
        for _ in range(15):
            agent.tick()
            assert runtime.launch(deployment.pk) == "not wanted"
        deployment.refresh_from_db()
        assert deployment.state == DeploymentState.STOPPED
        assert deployment.desired_state == DesiredState.STOPPED
        assert deployment.state_reason == STOPPED_BY_MAKE_STOP
        assert deployment.pid is None
        directory = Path(node_settings.ENGINE_LOG_DIR) / host.name
        assert process.read_record(directory, deployment.pk) is None

        # The next make run's seed queues exactly this deployment; the agent then launches it.
        assert start_what_make_stop_stopped() == 1
        deployment.refresh_from_db()
        assert (deployment.state, deployment.desired_state) == (DeploymentState.PENDING, DesiredState.RUNNING)
        runtime.launch(deployment.pk)
        deployment = tick_until(agent, deployment, READY)
        assert deployment.pid != pid
    finally:
        agent.close()


def test_a_deployment_stopped_from_the_console_stays_stopped(host: Any, make_deployment: Any) -> None:
    deployment = make_deployment(desired_state=DesiredState.STOPPED, state=DeploymentState.STOPPED)
    call_command("stop_engines", stdout=StringIO())
    assert start_what_make_stop_stopped() == 0
    deployment.refresh_from_db()
    assert (deployment.state, deployment.desired_state) == (DeploymentState.STOPPED, DesiredState.STOPPED)
