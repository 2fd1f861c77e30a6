"""The agent's own restarts while the control plane is away (nodes/agent/remote.py, _plan_relaunch and
relaunch_while_away): the control plane's backoff and limit, only for the launch it started, never for a
deployment being stopped, and none once the control plane answers again. The whole path, with a real
engine and the control plane cut, is tests/nodes/test_agent_loses_control_plane.py."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

from nodes.agent.remote import Agent, LocalEngine


def agent_away(tmp_path: Path) -> Agent:
    agent = Agent("h", control_plane=cast(Any, None), gpus=cast(Any, None), engine_dir=tmp_path)
    agent.connected = False
    agent.settings.update(max_restarts=2, restart_backoff_seconds=1.0, restart_backoff_max_seconds=1.5)
    agent.launched[7] = {
        "id": 7,
        "start_token": "t1",
        "desired_state": "running",
        "state": "ready",
        "port": 1,
    }
    return agent


def exited(token: str = "t1") -> LocalEngine:
    return LocalEngine(deployment_id=7, pid=0, start_token=token, port=1, log_path="", started_at=0.0)


def test_restarts_back_off_and_stop_at_the_limit(tmp_path: Path) -> None:
    agent = agent_away(tmp_path)
    began = time.monotonic()
    agent._plan_relaunch(exited())
    attempt, due = agent.relaunch_due[7]
    assert attempt == 1 and 0.9 < due - began < 1.2
    agent._plan_relaunch(exited())
    attempt, due = agent.relaunch_due[7]
    assert attempt == 2 and 1.4 < due - began < 1.7  # 2 s doubled, capped at 1.5
    del agent.relaunch_due[7]
    agent._plan_relaunch(exited())
    assert 7 not in agent.relaunch_due, "restarted past max_restarts"


def test_only_the_launch_it_started_and_never_one_being_stopped(tmp_path: Path) -> None:
    agent = agent_away(tmp_path)
    agent._plan_relaunch(exited("an-older-launch"))
    assert not agent.relaunch_due
    agent.deployments[7] = {**agent.launched[7], "state": "stopping"}
    agent._plan_relaunch(exited())
    assert not agent.relaunch_due
    agent.deployments[7] = {**agent.launched[7], "desired_state": "stopped"}
    agent._plan_relaunch(exited())
    assert not agent.relaunch_due


def test_the_control_plane_decides_once_it_answers(tmp_path: Path) -> None:
    agent = agent_away(tmp_path)
    agent._plan_relaunch(exited())
    assert agent.relaunch_due
    agent.connected = True
    agent.relaunch_while_away()
    assert not agent.relaunch_due and not agent.away_attempts
    agent._plan_relaunch(exited())
    assert not agent.relaunch_due, "restarted on its own with the control plane there"
