"""Fault knobs for the reliability tests: crash, hang, slow start, error rate."""

from __future__ import annotations

import socket
import time
import urllib.error

import pytest

from tests.sim.conftest import MODEL, SimFactory
from tests.sim.http import call, call_json
from vllm_sim.testing import start_sim

BODY = {"model": MODEL, "prompt": "hi", "max_tokens": 3}


def test_crash_after_n_requests_exits_and_drops_the_connection(sim_factory: SimFactory) -> None:
    sim = sim_factory("--max-model-len", "2048", "--sim-crash-after", "2")
    for _ in range(2):
        assert call(sim.base_url + "/v1/completions", BODY)[0] == 200
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        call(sim.base_url + "/v1/completions", BODY, timeout=5)
    assert sim.proc.wait(5) == 1
    assert "Simulated engine crash" in sim.log_text()


def test_hang_after_n_requests_stops_progress_but_health_stays_200(sim_factory: SimFactory) -> None:
    sim = sim_factory("--max-model-len", "2048", "--sim-hang-after", "1")
    assert call(sim.base_url + "/v1/completions", BODY)[0] == 200
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        call(sim.base_url + "/v1/completions", BODY, timeout=1.5)
    assert call(sim.base_url + "/health")[0] == 200
    _, stats = call_json(sim.base_url + "/sim/stats")
    assert stats["hung"] is True
    assert sim.alive()


def test_hung_stream_sends_headers_but_no_role_chunk(sim_factory: SimFactory) -> None:
    """As in vLLM, the role chunk goes out with the first engine output, so a hung engine's stream is
    headers only (what a proxy's first-byte timeout must catch); a healthy one sends role and text."""
    import http.client
    import json

    for hang, expect_body in (("0", False), ("5", True)):
        sim = sim_factory("--max-model-len", "2048", "--sim-hang-after", hang)
        conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=5)
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3,
            "stream": True,
        }
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.fp is not None
        sock = resp.fp.raw._sock  # type: ignore[attr-defined]
        sock.settimeout(1.0)
        if expect_body:
            first = resp.read1(65536)
            assert b'"role":"assistant"' in first and b'"content":"' in first
        else:
            with pytest.raises(TimeoutError):
                resp.read1(65536)
        conn.close()


def test_slow_start_accepts_connections_but_answers_only_when_ready(sim_factory: SimFactory) -> None:
    t0 = time.monotonic()
    sim = start_sim(MODEL, "--max-model-len", "2048", "--sim-startup-delay", "2", wait=False)
    try:
        deadline = time.monotonic() + 5
        while True:
            try:
                conn = socket.create_connection(("127.0.0.1", sim.port), timeout=0.5)
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        with conn:
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            conn.settimeout(0.5)
            with pytest.raises(TimeoutError):
                conn.recv(100)
        sim.wait_healthy(10)
        assert time.monotonic() - t0 >= 2.0
    finally:
        sim.stop()


def test_error_rate_answers_that_share_with_500(sim_factory: SimFactory) -> None:
    sim = sim_factory("--max-model-len", "2048", "--sim-error-rate", "0.5", "--seed", "1")
    errors = 0
    for _ in range(60):
        status, body = call_json(sim.base_url + "/v1/completions", BODY)
        if status == 500:
            errors += 1
            assert body["error"]["type"] == "InternalServerError" and body["error"]["code"] == 500
        else:
            assert status == 200
    assert 15 <= errors <= 45


def test_error_rate_one_fails_every_generation_but_not_health(sim_factory: SimFactory) -> None:
    sim = sim_factory("--max-model-len", "2048", "--sim-error-rate", "1")
    assert call_json(sim.base_url + "/v1/completions", BODY)[0] == 500
    assert call(sim.base_url + "/health")[0] == 200
