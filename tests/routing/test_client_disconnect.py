"""A client that hangs up mid-stream stops the engine's work and frees its concurrency lease at once."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable

import pytest

from routing.models import RequestLog
from tests.routing.conftest import Proc, make_tenant_key, post
from tests.routing.fleet import start_member

pytestmark = pytest.mark.django_db(transaction=True)


def test_hang_up_mid_stream(start_proxy: Callable[..., Proc], transactional_db: None) -> None:
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
                "stream": True,
            }
        ).encode()
        sock = socket.create_connection(("127.0.0.1", proxy.port))
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {tk.raw_key}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        received = b""
        while received.count(b"data: ") < 3:
            received += sock.recv(65536)
        sock.close()
        hung_up = time.monotonic()

        # The lease is free again long before 2000 tokens could have been generated.
        quick = {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        while post(proxy.url + "/v1/chat/completions", tk.raw_key, quick).status == 429:
            assert time.monotonic() - hung_up < 3, "lease still held after the client left"
            time.sleep(0.05)
        deadline = time.monotonic() + 5
        while not RequestLog.objects.filter(status=499).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        row = RequestLog.objects.get(status=499)
        assert row.error_type == "client_disconnected" and row.stream
        assert row.completion_tokens is not None and row.completion_tokens < 2000
    finally:
        member.sim.stop()
