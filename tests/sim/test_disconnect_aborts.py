"""A client that goes away mid-stream aborts its request: its KV blocks are freed, as in vLLM."""

from __future__ import annotations

import socket
import time

import orjson

from tests.sim.conftest import MODEL
from tests.sim.http import call, call_json
from vllm_sim.testing import SimHandle


def metric(sim: SimHandle, line_prefix: str) -> float:
    _, _, body = call(sim.base_url + "/metrics")
    for line in body.decode().splitlines():
        if line.startswith(line_prefix):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(line_prefix)


def test_closing_the_connection_aborts_the_request(sim: SimHandle) -> None:
    aborted = f'vllm:request_success_total{{engine="0",finished_reason="abort",model_name="{MODEL}"}}'
    before = metric(sim, aborted)
    body = orjson.dumps({"model": MODEL, "prompt": "long story", "max_tokens": 3000, "ignore_eos": True,
                         "stream": True})  # fmt: skip
    conn = socket.create_connection(("127.0.0.1", sim.port))
    conn.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    assert conn.recv(4096).startswith(b"HTTP/1.1 200")
    _, stats = call_json(sim.base_url + "/sim/stats")
    assert stats["running"] == 1
    conn.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        _, stats = call_json(sim.base_url + "/sim/stats")
        if stats["running"] == 0:
            break
        time.sleep(0.05)
    assert stats["running"] == 0
    assert stats["free_blocks"] == stats["num_gpu_blocks"]
    assert metric(sim, aborted) - before == 1
