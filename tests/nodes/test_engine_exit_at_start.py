"""An engine that exits at start: restarted with backoff, then FAILED with its last log lines."""

from __future__ import annotations

from typing import Any

import pytest

from nodes.agent import runtime
from nodes.choices import DeploymentState
from tests.nodes.conftest import in_state, supervisor_for, tick_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_exit_at_start_ends_failed_with_log_lines(
    host: Any, make_deployment: Any, node_settings: Any
) -> None:
    node_settings.NODE_MAX_RESTARTS = 2
    # The simulator's parser rejects a bad value and exits 2, as vLLM's would. (An unknown flag no longer
    # gets this far: extra_args are checked against vLLM's flags when saved and again at launch.)
    deployment = make_deployment(extra_args=["--sim-time-scale", "fast"])
    supervisor = supervisor_for(host)
    supervisor.start()
    assert runtime.launch(deployment.pk) == "started"

    deployment = tick_until(supervisor, deployment, in_state(DeploymentState.FAILED), timeout=40)
    assert "Gave up after 2 restarts" in deployment.state_reason
    assert "--sim-time-scale" in deployment.last_log_lines  # argparse names the bad flag
    crashes = deployment.events.filter(to_state=DeploymentState.CRASHED)
    assert crashes.count() == 2
    assert all("during start-up" in e.message for e in crashes)
    assert all(e.log_tail for e in crashes)
    # Exponential backoff: the second wait is twice the first.
    delays = [float(e.message.split(" in ")[1].split(" s")[0]) for e in crashes.order_by("at")]
    assert delays[1] == pytest.approx(2 * delays[0])
    supervisor.close()
