"""An engine on another host, reached over a network link rather than loopback: the proxy routes to it
over a veth pair into its own network namespace; when the link is cut (packets dropped, nothing
answers) no client request fails, the remote engine is ejected and left out of routing, and once the
link is restored it takes traffic again by itself. Uses tests/netns.py."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from nodes.models import Host
from routing.models import RequestLog, RoutePool
from tests.netns import remote_hosts  # noqa: F401 - fixture
from tests.routing.conftest import Proc, make_tenant_key, post
from tests.routing.fleet import FleetMember, start_member

pytestmark = pytest.mark.django_db(transaction=True)
CHAT = {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def _ejections(proxy: Proc) -> float:
    text = urllib.request.urlopen(proxy.url + "/metrics", timeout=5).read().decode()
    found = re.findall(r"^inferchain_proxy_ejections_total(?:\{[^}]*\})? (\S+)$", text, re.MULTILINE)
    return sum(float(v) for v in found)


def test_remote_engine_over_a_link_that_is_cut_and_restored(
    remote_hosts: Callable[[int], list],  # noqa: F811
    start_proxy: Callable[..., Proc],
    record_property: Callable[[str, object], None],
) -> None:
    (remote,) = remote_hosts(1)
    members: list[FleetMember] = []
    try:
        far_host = Host.objects.create(name="gpu-far", address=remote.address)
        far = start_member("llama", host=far_host, netns=remote.name)
        members.append(far)
        near = start_member("llama")
        members.append(near)
        assert far.sim.base_url.startswith(f"http://{remote.address}:")
        # A cut link drops packets: a pooled connection waits for its first byte, a new one for its
        # connect. Both are retried on the other engine; short timeouts keep the test short.
        RoutePool.objects.create(
            name="llama", alias="llama", connect_timeout_s=0.5, first_byte_timeout_s=1.0, max_retries=2
        )
        tk = make_tenant_key()
        proxy = start_proxy()
        url = proxy.url + "/v1/chat/completions"

        def burst(n: int) -> list[int]:
            try:
                with ThreadPoolExecutor(4) as pool:
                    return list(pool.map(lambda _: post(url, tk.raw_key, CHAT, timeout=15).status, range(n)))
            except TimeoutError:
                raise AssertionError(f"a request hung; the proxy's log:\n{proxy.log()[-3000:]}") from None

        def served_by(member: FleetMember) -> int:
            return RequestLog.objects.filter(deployment_id=member.deployment.pk, status=200).count()

        assert burst(24) == [200] * 24
        deadline = time.monotonic() + 5  # the request log is written in batches
        while served_by(far) == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert served_by(far) > 0, "the remote engine took no request over the link"

        remote.cut()
        cut_at = time.monotonic()
        statuses: list[int] = []
        while _ejections(proxy) < 1:
            assert time.monotonic() - cut_at < 15, f"the unreachable engine was never ejected: {statuses}"
            statuses += burst(4)
        assert statuses == [200] * len(statuses), "a client saw the cut link"
        record_property("ejected_after_cut_s", round(time.monotonic() - cut_at, 2))
        time.sleep(1.0)  # requests in flight when it was ejected are logged
        far_before = served_by(far)
        assert burst(16) == [200] * 16
        time.sleep(1.0)
        assert served_by(far) == far_before, "an ejected engine still got requests"

        remote.restore()
        restored_at = time.monotonic()
        # The breaker half-opens after its cooldown (2 s, doubled per failed probe during the cut).
        while served_by(far) == far_before:
            assert time.monotonic() - restored_at < 40, "the remote engine never came back"
            assert burst(4) == [200] * 4
            time.sleep(0.5)
        record_property("served_again_after_restore_s", round(time.monotonic() - restored_at, 2))
    finally:
        for member in members:
            member.sim.stop()
