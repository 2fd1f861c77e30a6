"""A GPU host on a network, not on loopback: its fleet agent (`python -m nodes.agent`, no database
settings) runs in a Linux network namespace of its own (tests/netns.py) and reaches the control plane
over a veth pair. It launches a simulator engine there, which the proxy, in the test's namespace, routes
to over the link. With the link cut the host is marked unreachable and its engine left out of routing
while another engine serves every request; with the link restored the agent catches up by itself and
the engine serves again."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from models_registry.models import ModelAlias
from nodes.agent_tokens import issue_agent_token
from nodes.choices import DeploymentState, HostState
from nodes.lifecycle import mark_unreachable_hosts
from nodes.models import Deployment, Host
from routing.models import RequestLog
from tests.netns import RemoteHost, remote_hosts  # noqa: F401 - fixture
from tests.nodes.agent_channel import Relay, agent_env, wait_for

# start_proxy is the routing tests' fixture (a proxy process), used here by name.
from tests.routing.conftest import Proc, make_tenant_key, post, start_proxy  # noqa: F401
from tests.routing.fleet import FleetMember, start_member

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
ALIAS = "llama-3.1-8b"
CHAT = {"model": ALIAS, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_agent_and_engine_across_a_link_that_is_cut_and_restored(
    remote_hosts: Callable[[int], list[RemoteHost]],  # noqa: F811
    live_server: Any,
    make_deployment: Callable[..., Deployment],
    node_settings: Any,
    start_proxy: Callable[..., Proc],  # noqa: F811
    agents: list[subprocess.Popen[bytes]],
    redis_clean: None,
    tmp_path: Path,
) -> None:
    (remote,) = remote_hosts(1)
    node_settings.NODE_UNREACHABLE_SECONDS = 2.0
    # The agent names the control plane by the address it reaches it at, as a remote agent does.
    node_settings.ALLOWED_HOSTS = [*node_settings.ALLOWED_HOSTS, remote.gateway]
    far_host = Host.objects.create(name="gpu-far", address=remote.address)
    token = issue_agent_token(far_host).raw_token
    # The control plane, as the far host sees it: the test's end of the link.
    relay = Relay("127.0.0.1", int(live_server.url.rsplit(":", 1)[1]), bind=remote.gateway)
    log = tmp_path / "agent.log"
    near: FleetMember | None = None
    try:
        argv = [
            sys.executable, "-m", "nodes.agent", "--host", far_host.name,
            "--control-plane", f"http://{remote.gateway}:{relay.port}",
            "--engine-dir", str(tmp_path / "engines"), "--simulated-gpus", "1",
        ]  # fmt: skip
        agents.append(
            remote.popen(
                argv,
                env=agent_env(token),
                stdout=log.open("ab"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        far = make_deployment(host=far_host)

        def state(pk: int) -> str:
            return Deployment.objects.get(pk=pk).state

        wait_for(lambda: state(far.pk) == DeploymentState.READY, 60, "the far engine ready", log)
        # Both engines serve the alias's active version (the pool routes by version).
        ModelAlias.objects.create(name=ALIAS, active_version=far.model_version)
        near = start_member(ALIAS, max_model_len=4096)
        proxy = start_proxy()
        tk = make_tenant_key()
        url = proxy.url + "/v1/chat/completions"

        def burst(n: int) -> list[int]:
            with ThreadPoolExecutor(4) as pool:
                return list(pool.map(lambda _: post(url, tk.raw_key, CHAT, timeout=20).status, range(n)))

        def served_by_far() -> int:
            return RequestLog.objects.filter(deployment_id=far.pk, status=200).count()

        first = post(url, tk.raw_key, CHAT, timeout=20)
        assert first.status == 200, (first.text, proxy.log()[-3000:])
        assert burst(24) == [200] * 24
        wait_for(lambda: served_by_far() > 0, 10, "a request routed over the link", log)

        remote.cut()
        cut_at = time.monotonic()
        statuses: list[int] = []
        while far_host.name not in mark_unreachable_hosts():
            assert time.monotonic() - cut_at < 20, "the far host was never marked unreachable"
            statuses += burst(4)
        assert Host.objects.get(pk=far_host.pk).state == HostState.UNREACHABLE
        assert state(far.pk) == DeploymentState.DEGRADED
        time.sleep(1.0)  # the proxy's snapshot follows the change; in-flight rows are logged
        statuses += burst(16)
        assert statuses == [200] * len(statuses), "a client saw the cut link"
        far_before = served_by_far()
        assert burst(16) == [200] * 16
        time.sleep(1.0)
        assert served_by_far() == far_before, "an unreachable host's engine still got requests"
        assert near.sim.alive()

        remote.restore()
        wait_for(lambda: state(far.pk) == DeploymentState.READY, 30, "the far engine ready again", log)
        assert Host.objects.get(pk=far_host.pk).state == HostState.ONLINE
        restored_at = time.monotonic()
        while served_by_far() == far_before:
            assert time.monotonic() - restored_at < 20, "the far engine never served again"
            assert burst(4) == [200] * 4
            time.sleep(0.3)
    finally:
        relay.close()
        if near is not None:
            near.sim.stop()  # it outlived every run before: three idle simulators after three runs
