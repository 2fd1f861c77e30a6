"""One simulated GPU host with a registered Llama-3.1-8B version and one simulator deployment on it,
for benchmarks that drive a real engine through the agent's supervisor (live_feed_latency.py,
sleep_wake.py). Django must be set up first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_sim.testing import free_port


def sim_host_engine(tmp: Path, served_model_name: str, **fields: Any) -> tuple[Any, Any]:
    """A host "bench-a" with one simulated H100, the version, a simulator deployment serving
    `served_model_name` (`fields` added to it), and the host's supervisor, started; the engine is not
    launched. Returns (supervisor, deployment)."""
    from django.utils import timezone

    from models_registry.models import Model
    from models_registry.services import register_version
    from nodes.agent.gpus import GpuSource, simulated_gpu_config
    from nodes.agent.services import report_gpus
    from nodes.agent.supervisor import Supervisor
    from nodes.choices import Engine, HostState
    from nodes.demo import LLAMA_31_8B_CONFIG, write_config_dir
    from nodes.models import Deployment, Host

    host = Host.objects.create(name="bench-a", state=HostState.ONLINE, last_heartbeat=timezone.now())
    gpus = GpuSource(host.name, simulated_gpu_config("h100-llama3-8b-fp16", 1))
    report_gpus(host, gpus.inventory())
    version = register_version(
        model=Model.objects.create(name="Llama-3.1-8B-Instruct"),
        revision="fp16",
        source_path=str(write_config_dir(tmp / "models" / "llama", LLAMA_31_8B_CONFIG)),
        host_name=host.name,
    )
    deployment = Deployment.objects.create(
        name="bench-engine",
        model_version=version,
        engine=Engine.SIM,
        host=host,
        gpu_indices=[0],
        max_model_len=8192,
        max_num_seqs=32,
        port=free_port(),
        served_model_name=served_model_name,
        **fields,
    )
    supervisor = Supervisor(host.name, gpus)
    supervisor.start()
    return supervisor, deployment


def supervise(host_name: str, profile: str, gpus: int) -> None:
    """The agent's supervisor loop for `host_name`, as `python -m nodes.agent` runs it
    (nodes/agent/main.py), until SIGTERM: probes every engine's /health, /v1/models and /metrics once
    per NODE_TELEMETRY_SECONDS and writes the live records (KV-cache use included) the proxy's scorers
    read. Without the agent's Celery worker (no task is sent to it here) and without `start()`'s
    re-adoption: the engines are the caller's simulators, not started by an agent, so adoption would
    find no engine record of theirs and count them as crashed. Django must be set up first."""
    import signal

    from nodes.agent.gpus import GpuSource, simulated_gpu_config
    from nodes.agent.supervisor import Supervisor

    supervisor = Supervisor(host_name, GpuSource(host_name, simulated_gpu_config(profile, gpus)))
    signal.signal(signal.SIGTERM, lambda *_: supervisor.stop_event.set())
    try:
        supervisor.run()
    finally:
        supervisor.close()


if __name__ == "__main__":
    # `python benchmarks/simhost.py HOST PROFILE GPUS`: the supervisor loop above (routing_scenarios.py
    # runs it in a process of its own, with the repository on PYTHONPATH, so its probes do not share the
    # load client's interpreter).
    import os
    import sys

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inferchain.settings")
    import django

    django.setup()
    supervise(sys.argv[1], sys.argv[2], int(sys.argv[3]))
