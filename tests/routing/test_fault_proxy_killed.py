"""A proxy process killed (SIGKILL) with requests in flight: their concurrency leases stop being renewed
and lapse, so the tenant's capacity returns to the other proxies within the lease time, not never."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.routing.conftest import Proc, make_tenant_key, post
from tests.routing.fleet import start_member
from tests.routing.load import Client, Load, summary

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
LEASE_MS = 3000
LONG = {
    "model": "llama",
    "messages": [{"role": "user", "content": "a long story"}],
    "max_tokens": 2000,
    "ignore_eos": True,
    "stream": True,
}
SHORT = {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


def test_killed_proxy_leases_lapse_within_the_lease_time(start_proxy: Callable[..., Proc]) -> None:
    member = start_member("llama", time_scale=1.0)  # real-time decoding: the long streams last minutes
    try:
        tk = make_tenant_key(max_concurrent_requests=4)
        doomed, survivor = (start_proxy(PROXY_LEASE_MS=str(LEASE_MS)) for _ in range(2))
        url = survivor.url + "/v1/chat/completions"
        load = Load([Client("long", doomed.url + "/v1/chat/completions", tk.raw_key, LONG, concurrency=4)])
        with load:
            deadline = time.monotonic() + 15
            while (refused := post(url, tk.raw_key, SHORT)).status != 429:
                assert time.monotonic() < deadline, "the long streams never took the four leases"
                time.sleep(0.2)
            print(f"\nrefused while the leases are held: {refused.json()['error']}")
            time.sleep(LEASE_MS / 1000)  # renewals keep the leases past their first term
            assert post(url, tk.raw_key, SHORT).status == 429
            doomed.proc.send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            doomed.proc.wait(5)
            statuses: list[int] = []
            while True:
                status = post(url, tk.raw_key, SHORT).status
                statuses.append(status)
                if status == 200:
                    break
                assert time.monotonic() - killed_at < LEASE_MS / 1000 + 2, statuses
                time.sleep(0.1)
            returned_s = time.monotonic() - killed_at
        print(
            f"\nproxy killed with 4 leases held: capacity back on the other proxy {returned_s:.2f} s later "
            f"(lease {LEASE_MS} ms, renewed every {LEASE_MS / 3000:.0f} s); refused meanwhile: "
            f"{statuses.count(429)}; the killed proxy's clients saw {summary(load.samples)}"
        )
        # Within the lease time of the kill (its last renewal came before it), plus the probe round trip
        # on a busy machine.
        assert returned_s <= LEASE_MS / 1000 + 1.0
        assert statuses[0] == 429  # still held right after the kill: leases lapse, they are not dropped
        # All four slots are back, not one: five at once, four admitted.
        body = {**SHORT, "max_tokens": 60, "ignore_eos": True}
        with ThreadPoolExecutor(5) as pool:
            burst = sorted(
                r.status for r in pool.map(lambda _: post(url, tk.raw_key, body, timeout=30), range(5))
            )
        assert burst == [200, 200, 200, 200, 429], burst
    finally:
        member.sim.stop()
