"""A host whose agent is gone and whose engine stops answering: while the host still counts as online the
proxy retries around the silent engine (first-byte timeout) and ejects it; once the heartbeat sweep marks
the host unreachable its engines leave the proxy's snapshot, so they get no traffic at all, not even the
breaker's half-open probes, even after the engine would answer again.

The agent's own side (killed and restarted: engines re-adopted, not duplicated) is
tests/nodes/test_agent_process.py and tests/nodes/test_readopt_after_agent_restart.py.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.utils import timezone

from nodes.choices import DeploymentState, HostState
from nodes.lifecycle import mark_unreachable_hosts
from nodes.models import Deployment, Host
from routing.models import RequestLog, RoutePool
from tests.routing.conftest import Proc, make_tenant_key, post
from tests.routing.fleet import start_member

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("redis_clean"),
]
BODY = {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}


def test_unreachable_host_engines_are_not_routed_to(start_proxy: Callable[..., Proc]) -> None:
    lost = start_member("llama")
    kept = start_member("llama")
    lost_host = Host.objects.create(name="lost-host", address="127.0.0.1", state=HostState.ONLINE)
    Deployment.objects.filter(pk=lost.deployment.pk).update(host=lost_host)
    Host.objects.filter(name="sim-host").update(state=HostState.ONLINE, last_heartbeat=timezone.now())
    try:
        RoutePool.objects.create(
            name="llama", alias="llama", scorer="round_robin", first_byte_timeout_s=0.5, max_retries=1
        )
        tk = make_tenant_key()
        proxy = start_proxy()
        url = proxy.url + "/v1/chat/completions"
        assert all(post(url, tk.raw_key, BODY).status == 200 for _ in range(4))

        # The agent is gone and the engine stops answering (frozen: connections open, nothing comes back).
        os.kill(lost.sim.proc.pid, signal.SIGSTOP)
        before = RequestLog.objects.count()
        frozen = [post(url, tk.raw_key, BODY) for _ in range(10)]
        assert all(r.status == 200 for r in frozen), [r.status for r in frozen]

        # The console's heartbeat sweep notices the silent agent.
        Host.objects.filter(pk=lost_host.pk).update(last_heartbeat=timezone.now() - timedelta(minutes=5))
        Host.objects.filter(name="sim-host").update(last_heartbeat=timezone.now())  # its agent still beats
        assert mark_unreachable_hosts() == ["lost-host"]
        marked_at = time.monotonic()
        assert Deployment.objects.get(pk=lost.deployment.pk).state == DeploymentState.DEGRADED
        os.kill(lost.sim.proc.pid, signal.SIGCONT)  # it would answer now, if it were asked
        time.sleep(1.0)  # the config change reaches the proxy over Redis pub/sub
        cut = RequestLog.objects.count()
        after = []
        while time.monotonic() - marked_at < 6.0:  # past the breaker's cooldown: a probe would go out
            after.append(post(url, tk.raw_key, BODY))
            time.sleep(0.1)

        deadline = time.monotonic() + 5
        while RequestLog.objects.count() < cut + len(after) and time.monotonic() < deadline:
            time.sleep(0.1)
        frozen_rows = list(RequestLog.objects.order_by("id")[before:cut])
        after_rows = list(RequestLog.objects.order_by("id")[cut:])
        retried = sum(1 for r in frozen_rows if r.retries)
        waited = max((r.latency_ms or 0) for r in frozen_rows)
        on_lost = sum(1 for r in after_rows if r.deployment_id == lost.deployment.pk)
        print(
            f"\nagent gone, engine frozen: {len(frozen)} requests all 200, {retried} retried after the "
            f"first-byte timeout (slowest {waited:.0f} ms); after the host was marked unreachable: "
            f"{len(after_rows)} requests, "
            f"{on_lost} sent to its engine, {sum(1 for r in after_rows if r.retries)} retried"
        )
        assert 1 <= retried <= 3  # until the breaker opened (three failures)
        assert all(r.status == 200 for r in after)
        assert after_rows and all(
            r.deployment_id == kept.deployment.pk and r.retries == 0 for r in after_rows
        )
    finally:
        if lost.sim.proc.poll() is None:
            os.kill(lost.sim.proc.pid, signal.SIGCONT)
        lost.sim.stop()
        kept.sim.stop()
