"""Redis restarted under load: limited keys get the documented 503 `limits_unavailable` while it is down,
unlimited keys keep being served, and the proxy recovers by itself once Redis is back (no restart).

Redis is a private `redis-server` on its own port (the shared one serves everyone on the machine).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from tests.routing.conftest import Proc, make_tenant_key
from tests.routing.load import Client, Load, summary
from tests.routing.private_services import PrivateRedis

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
BODY = {"model": "trivial", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
OUTAGE_S = 3.0
AFTER_S = 4.0


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    server = PrivateRedis(abrupt=True)  # a crash: clients get no goodbye
    server.start()
    yield server
    server.close()


def test_redis_restart_under_load(
    start_proxy: Callable[..., Proc], trivial_backend: Proc, private_redis: PrivateRedis
) -> None:
    limited = make_tenant_key("limited", requests_per_minute=1_000_000)
    unlimited = make_tenant_key("unlimited")
    proxies = [
        start_proxy(static=f"trivial={trivial_backend.url}", REDIS_URL=private_redis.url) for _ in range(2)
    ]
    clients = [
        Client(label, p.url + "/v1/chat/completions", key, BODY, concurrency=2)
        for p in proxies
        for label, key in (("limited", limited.raw_key), ("unlimited", unlimited.raw_key))
    ]
    with Load(clients, timeout=10, pause=0.01) as load:
        time.sleep(1.5)
        down_at = time.monotonic()
        private_redis.stop()
        time.sleep(OUTAGE_S)
        restart_at = time.monotonic()  # it may answer before start() returns: the outage ends here
        private_redis.start()
        up_at = time.monotonic()
        time.sleep(AFTER_S)
    end = time.monotonic()

    before = load.between(0, down_at)
    during = load.between(down_at + 1.0, restart_at)  # after the loss is certain, before the restart
    after = [s for s in load.samples if s.started >= up_at]
    limited_after = [s for s in after if s.label == "limited"]
    first_ok = min((s.ended for s in limited_after if s.status == 200), default=None)
    recovered_s = None if first_ok is None else first_ok - up_at
    late = [s for s in limited_after if s.started >= up_at + 1.0]
    print(
        f"\nredis restart: before {summary(before)}; during {summary(during)}; after {summary(after)}; "
        f"limited key served again {recovered_s if recovered_s is None else round(recovered_s, 3)} s "
        f"after Redis returned; errors from 1 s after: {summary(s for s in late if s.status != 200)}"
    )

    assert before and all(s.status == 200 for s in before), summary(before)
    # The documented degraded mode: limited keys fail closed at once, unlimited keys are served.
    limited_during = [s for s in during if s.label == "limited"]
    unlimited_during = [s for s in during if s.label == "unlimited"]
    assert limited_during and all(
        s.status == 503 and s.code == "limits_unavailable" for s in limited_during
    ), summary(limited_during)
    assert max(s.ended - s.started for s in limited_during) < 1.5  # refused quickly, not hung
    assert unlimited_during and all(s.status == 200 for s in unlimited_during), summary(unlimited_during)
    # Recovery by itself, the same processes: served within a second and every request after that.
    assert recovered_s is not None and recovered_s < 1.0, summary(limited_after)
    assert late and all(s.status == 200 for s in late), summary(late)
    assert all(s.status == 200 for s in after if s.label == "unlimited"), summary(after)
    assert all(p.proc.poll() is None for p in proxies)
    assert end - up_at >= AFTER_S
