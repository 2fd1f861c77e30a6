"""A client that hangs up on a non-streaming request aborts the engine call and frees its lease at once."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from collections.abc import Callable

import pytest

from routing.models import RequestLog
from tests.routing.conftest import Proc, make_tenant_key, post
from tests.routing.fleet import start_member

pytestmark = pytest.mark.django_db(transaction=True)


def running_on_engine(base_url: str) -> float:
    """vllm:num_requests_running from the simulator's /metrics."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("vllm:num_requests_running"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no vllm:num_requests_running in the engine's metrics")


def test_hang_up_while_engine_holds_request(start_proxy: Callable[..., Proc], transactional_db: None) -> None:
    member = start_member("llama", time_scale=1.0)
    try:
        tk = make_tenant_key(max_concurrent_requests=1)
        proxy = start_proxy()
        body = json.dumps(
            {
                "model": "llama",
                "messages": [{"role": "user", "content": "a long story"}],
                "max_tokens": 2000,
                "ignore_eos": True,
            }
        ).encode()
        sock = socket.create_connection(("127.0.0.1", proxy.port))
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {tk.raw_key}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        # The engine is generating (2000 tokens take far longer than this test waits).
        deadline = time.monotonic() + 10
        while running_on_engine(member.sim.base_url) < 1:
            assert time.monotonic() < deadline, "the request never reached the engine"
            time.sleep(0.05)
        sock.close()
        hung_up = time.monotonic()

        # The lease is free again at once, not when the engine would have finished.
        quick = {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        while post(proxy.url + "/v1/chat/completions", tk.raw_key, quick).status == 429:
            assert time.monotonic() - hung_up < 3, "lease still held after the client left"
            time.sleep(0.05)
        # And the engine stopped working on the abandoned request (the proxy closed its connection).
        while running_on_engine(member.sim.base_url) > 0:
            assert time.monotonic() - hung_up < 5, "the engine still runs the abandoned request"
            time.sleep(0.05)
        deadline = time.monotonic() + 5
        while not RequestLog.objects.filter(status=499).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        row = RequestLog.objects.get(status=499)
        assert row.error_type == "client_disconnected" and not row.stream
        assert row.completion_tokens is None and row.endpoint_kind == "chat"
    finally:
        member.sim.stop()
