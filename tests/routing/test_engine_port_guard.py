"""The engine port refuses every request without the engine key, on every path vLLM serves.

vLLM's `--api-key` guards only /v1, /v2, /inference and /cohere; the adapter loads
nodes/engines/guard.py with vLLM's `--middleware` flag so that /invocations, /tokenize, the dev
endpoints and the rest need the key too. The simulator serves vLLM's unguarded paths unguarded (the
first test shows the hole is real there), runs `--middleware` as vLLM does, and is launched here
with exactly the adapter's command line and environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nodes.engines import sim
from nodes.engines.base import EngineSpec
from tests.routing.conftest import REPO, Proc, free_port, make_tenant_key, post, wait_http
from vllm_sim.testing import start_sim

pytestmark = pytest.mark.django_db(transaction=True)
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PATHS = Path(__file__).resolve().parents[1] / "data" / "vllm" / "engine_paths.txt"
ENGINE_KEY = "engine-key-" + "7" * 32
CHAT = {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
BODIES = {
    "/invocations": CHAT,
    "/tokenize": {"model": "llama", "prompt": "hello there"},
    "/detokenize": {"model": "llama", "tokens": [1, 2, 3]},
}


def engine_paths() -> list[tuple[str, str, str]]:
    rows = []
    for line in PATHS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            method, path, guard = line.split()
            rows.append((method, path, guard))
    return rows


def call(url: str, method: str, path: str, key: str | None) -> int:
    data = json.dumps(BODIES.get(path, {})).encode() if method == "POST" else None
    req = urllib.request.Request(url + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if key is not None:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as err:
        err.read()
        return int(err.code)


@pytest.fixture
def guarded_engine() -> Iterator[Proc]:
    """A simulator started from the adapter's own argv and environment, as the agent starts it."""
    spec = EngineSpec(
        model_path=MODEL,
        served_model_name="llama",
        port=free_port(),
        api_key=ENGINE_KEY,
        bind_host="127.0.0.1",
        extra_args=("--sim-time-scale", "50"),
    )
    argv = sim.build_argv(spec)
    env = {**os.environ, **sim.build_env(spec), "VLLM_SERVER_DEV_MODE": "1", "PYTHONUNBUFFERED": "1"}
    log_path = Path(tempfile.mkstemp(prefix="guarded-sim-", suffix=".log")[1])
    with log_path.open("wb") as fh:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT)
    handle = Proc(proc, spec.port, log_path)
    try:
        wait_http(f"{handle.url}/health", proc, log_path)
        yield handle
    finally:
        handle.stop()


def test_vllms_open_paths_are_open_on_the_unguarded_simulator() -> None:
    """Without the guard, the simulator (like vLLM) answers /invocations, /tokenize, ... to anyone."""
    engine = start_sim(
        MODEL,
        "--served-model-name",
        "llama",
        api_key=ENGINE_KEY,
        time_scale=50,
        env={"VLLM_SERVER_DEV_MODE": "1"},
    )
    try:
        served_open = set()
        for method, path, guard in engine_paths():
            status = call(engine.base_url, method, path, None)
            if guard == "guarded":
                assert status == 401, (method, path, status)
            elif status not in (404, 405):
                assert status != 401, (method, path)
                served_open.add(path)
        assert {"/invocations", "/tokenize", "/detokenize", "/metrics", "/sleep"} <= served_open
        assert call(engine.base_url, "POST", "/invocations", None) == 200  # a free chat completion
    finally:
        engine.stop()


def test_guarded_engine_refuses_every_path_without_the_key(guarded_engine: Proc) -> None:
    url = guarded_engine.url
    cmdline = Path(f"/proc/{guarded_engine.proc.pid}/cmdline").read_bytes()
    assert ENGINE_KEY.encode() not in cmdline and b"nodes.engines.guard.EngineKeyGuard" in cmdline
    for method, path, _ in engine_paths():
        if (method, path) == ("GET", "/health"):
            assert call(url, method, path, None) == 200  # liveness stays open, and says nothing else
            continue
        assert call(url, method, path, None) == 401, (method, path)
        assert call(url, method, path, "not-the-key") == 401, (method, path)
    for path in ("/invocations", "/tokenize", "/detokenize"):
        assert call(url, "POST", path, ENGINE_KEY) == 200, path
    assert call(url, "GET", "/metrics", ENGINE_KEY) == 200


def test_through_the_proxy_the_guarded_engine_serves(
    guarded_engine: Proc, start_proxy: Callable[..., Proc]
) -> None:
    tenant = make_tenant_key("guarded")
    proxy = start_proxy(static=f"llama={guarded_engine.url}|{ENGINE_KEY}")
    reply = post(proxy.url + "/v1/chat/completions", tenant.raw_key, CHAT)
    assert reply.status == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"]
    streamed = post(proxy.url + "/v1/chat/completions", tenant.raw_key, {**CHAT, "stream": True})
    assert streamed.status == 200 and "[DONE]" in streamed.text


def test_the_guard_imports_without_django() -> None:
    """vLLM's interpreter imports it by path (`--middleware`): it must not need the console's settings."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    code = "import sys, nodes.engines.guard; print('django' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
