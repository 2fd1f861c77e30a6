"""Two restart counts: the current streak (reset by a start or a stable run) and the lifetime total (never
reset), so the console can say "restarts 0" only when the engine never crashed."""

from __future__ import annotations

from typing import Any

import pytest

from nodes.agent import runtime
from nodes.choices import DeploymentState
from nodes.services import request_start

pytestmark = pytest.mark.django_db


def test_crashes_add_to_both_counts_and_a_start_resets_only_the_streak(
    make_deployment: Any, admin_client: Any, redis_clean: None
) -> None:
    deployment = make_deployment(state=DeploymentState.READY, pid=None)
    runtime.record_crash(deployment, "The engine exited with code 1.")
    deployment.refresh_from_db()
    runtime.record_crash(deployment, "The engine exited with code 1.")
    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.CRASHED
    assert (deployment.restart_count, deployment.restarts_total) == (2, 2)

    request_start(deployment)
    deployment.refresh_from_db()
    assert (deployment.restart_count, deployment.restarts_total) == (0, 2)

    shown = admin_client.get(f"/api/deployments/{deployment.pk}/").json()
    assert (shown["restart_count"], shown["restarts_total"]) == (0, 2)


def test_giving_up_does_not_count_a_restart(make_deployment: Any, settings: Any) -> None:
    settings.NODE_MAX_RESTARTS = 1
    deployment = make_deployment(state=DeploymentState.READY)
    runtime.record_crash(deployment, "Crash one.")
    deployment.refresh_from_db()
    runtime.record_crash(deployment, "Crash two.")
    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.FAILED
    assert (deployment.restart_count, deployment.restarts_total) == (1, 1)
