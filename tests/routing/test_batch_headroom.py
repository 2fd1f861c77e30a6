"""Interactive requests go first: batch requests are shed once the pool's in-flight reaches
`batch_max_fraction` of its capacity, while interactive ones are still admitted past it."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from routing.models import RoutePool
from tests.routing.conftest import Proc, Reply, make_tenant_key, post

pytestmark = pytest.mark.django_db(transaction=True)
BODY = {"model": "slow", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
ANSWER = json.dumps(
    {
        "id": "chatcmpl-held",
        "object": "chat.completion",
        "created": 0,
        "model": "slow",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()


class HeldBackend:
    """An engine on loopback that holds every request until released, so in-flight counts are exact."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.arrived = 0
        self._cond = threading.Condition()
        backend = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                with backend._cond:
                    backend.arrived += 1
                    backend._cond.notify_all()
                backend.release.wait(30)
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(ANSWER)))
                self.end_headers()
                self.wfile.write(ANSWER)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_arrived(self, count: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self.arrived >= count, timeout=10), (
                f"{self.arrived} requests reached the engine, expected {count}"
            )

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def held_backend() -> Iterator[HeldBackend]:
    backend = HeldBackend()
    try:
        yield backend
    finally:
        backend.close()


def test_batch_is_shed_at_the_headroom_while_interactive_is_admitted(
    start_proxy: Callable[..., Proc], held_backend: HeldBackend
) -> None:
    # Capacity 5 (one endpoint x 5); batch may fill 60% of it, i.e. 3 requests in flight.
    RoutePool.objects.create(name="slow", alias="slow", max_inflight_per_endpoint=5, batch_max_fraction=0.6)
    tk = make_tenant_key()
    proxy = start_proxy(static=f"slow={held_backend.url}")
    url = proxy.url + "/v1/chat/completions"
    pool = ThreadPoolExecutor(max_workers=8)
    held: list[Future[Reply]] = []

    def send(priority: str, expect_held: int) -> None:
        held.append(pool.submit(post, url, tk.raw_key, BODY, None, 30, {"x-priority": priority}))
        held_backend.wait_arrived(expect_held)

    try:
        send("interactive", 1)
        send("interactive", 2)
        send("batch", 3)  # 2 in flight < 3: batch still admitted
        shed = post(url, tk.raw_key, BODY, headers={"x-priority": "batch"})
        assert shed.status == 429, shed.text
        assert shed.json()["error"]["code"] == "pool_saturated"
        assert shed.headers["retry-after"] == "1"
        # The headroom above the batch share is interactive traffic's, up to capacity and beyond it
        # (the engine queues what the pool cannot run at once).
        send("interactive", 4)
        send("interactive", 5)
        send("interactive", 6)
        assert held_backend.arrived == 6
        held_backend.release.set()
        assert [f.result(timeout=30).status for f in held] == [200] * 6
        # Once the pool drains, batch is admitted again.
        assert post(url, tk.raw_key, BODY, headers={"x-priority": "batch"}).status == 200
    finally:
        held_backend.release.set()
        pool.shutdown(wait=True)
