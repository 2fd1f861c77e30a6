"""Sleep and wake on a host whose agent talks only to the agent channel (`python -m nodes.agent`, no
database): the control plane's worker puts the engine to sleep through its dev endpoints, the agent
leaves the sleeper alone (queued requests and no token progress are no hang), and a request the proxy
holds is served once the next sync sees its wake key and the worker wakes the engine."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from core.celery import app
from nodes import process
from nodes.agent_tokens import issue_agent_token
from nodes.choices import DeploymentState
from nodes.models import Deployment, Host
from nodes.services import request_sleep
from tests.nodes.agent_channel import kill, start_agent, wait_for

# start_proxy is the routing tests' fixture (a proxy process), used here by name.
from tests.routing.conftest import Proc, make_tenant_key, start_proxy  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
ALIAS = "llama-3.1-8b"


@pytest.fixture
def eager_tasks() -> Iterator[None]:
    """The control queue's tasks run where they are sent (there is no worker here)."""
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


def test_fleet_agent_host_sleeps_and_wakes_on_request(
    live_server: Any,
    host: Host,
    make_deployment: Callable[..., Deployment],
    start_proxy: Callable[..., Proc],  # noqa: F811
    tmp_path: Path,
    redis_clean: None,
    eager_tasks: None,
    node_settings: Any,
) -> None:
    node_settings.NODE_HANG_SECONDS = 1.0  # a sleeper the agent judged by token progress would be killed
    token = issue_agent_token(host).raw_token
    deployment = make_deployment(sleep_enabled=True, sleep_level=1)
    log = tmp_path / "agent.log"
    agent: subprocess.Popen[bytes] = start_agent(host.name, live_server.url, token, tmp_path / "engines", log)
    try:

        def current() -> Deployment:
            return Deployment.objects.get(pk=deployment.pk)

        wait_for(lambda: current().state == DeploymentState.READY, 60, "ready", log)
        ready = current()
        assert "--enable-sleep-mode" in ready.launch_argv

        request_sleep(ready, 1)
        assert current().state == DeploymentState.SLEEPING
        time.sleep(2.5)  # more than the hang bound, with the agent syncing every 0.2 s
        asleep = current()
        assert asleep.state == DeploymentState.SLEEPING
        assert asleep.pid is not None and process.is_alive(asleep.pid)

        proxy = start_proxy()
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=make_tenant_key().raw_key, max_retries=0)
        reply = client.chat.completions.create(
            model=ALIAS, messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )
        assert reply.choices[0].message.content
        awake = current()
        assert awake.state == DeploymentState.READY and awake.pid == ready.pid
        messages = list(awake.events.values_list("message", flat=True))
        assert any("woken on request" in m for m in messages), messages
    finally:
        kill(agent)
