"""What the node agent writes for its host: heartbeats, the GPU inventory, and an engine's command line."""

from __future__ import annotations

import importlib.metadata
import re
import secrets
import sys
import time
from typing import Any

from django.db import transaction
from django.utils import timezone

from core.live import FLEET_GROUP, host_group
from core.redis_client import publish_config_change
from nodes.choices import SLEEP_CAPABLE_ENGINES, HostState
from nodes.engines import EngineSpec
from nodes.lifecycle import engine_api_key, push_event
from nodes.models import DEFAULT_MASTER_PORT, Deployment, Gpu, Host
from nodes.preflight import vllm_dtype, vllm_kv_cache_dtype, vllm_quantization_flag
from nodes.spec import DeploySpec, StageHost


def bind_host_for(host: Host) -> str:
    """Engines on a loopback-addressed host listen on loopback only; others on all interfaces."""
    return "127.0.0.1" if host.address in ("127.0.0.1", "localhost", "::1") else "0.0.0.0"


def engine_spec(
    deployment: Deployment,
    *,
    python: str | None = None,
    model_path: str | None = None,
    member: StageHost | None = None,
) -> EngineSpec:
    """The adapter input for `deployment`: its DeploySpec, mapped to engine flags, with its current key.

    `model_path` is where this host holds the files when they came from the model store; without it
    the engine loads the version's source_path. `member`: the command line of a member host of a
    deployment spanning hosts with the mp backend (`vllm serve --headless` with its node rank, its
    GPUs and address, and no engine key: it serves no API).
    """
    spec = DeploySpec.from_deployment(deployment)
    method = getattr(spec.quantization, "method", None)
    node = member or StageHost(spec.host, spec.gpu_indices, 0)
    mp = spec.uses_mp
    return EngineSpec(
        model_path=model_path or spec.model_version.source_path,
        served_model_name=deployment.served_model_name,
        port=spec.port,
        api_key="" if member else engine_api_key(deployment),
        bind_host=bind_host_for(node.host),
        quantization_method=vllm_quantization_flag(spec),
        kv_cache_dtype=vllm_kv_cache_dtype(getattr(spec.quantization, "kv_cache_dtype", None)),
        dtype=vllm_dtype(method),
        gpu_indices=tuple(node.gpu_indices),
        gpu_memory_utilization=spec.gpu_memory_utilization,
        max_model_len=spec.max_model_len,
        block_size=spec.block_size,
        max_num_seqs=spec.max_num_seqs,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        tensor_parallel_size=spec.tensor_parallel_size,
        pipeline_parallel_size=spec.pipeline_parallel_size,
        enable_prefix_caching=spec.enable_prefix_caching,
        enable_sleep_mode=deployment.sleep_enabled and deployment.engine in SLEEP_CAPABLE_ENGINES,
        extra_args=spec.extra_args,
        python=python or sys.executable,
        distributed_executor_backend=spec.multi_host_backend if spec.spans_hosts else None,
        ray_address=deployment.ray_head_address if spec.uses_ray else None,
        node_ip=node.host.address if spec.spans_hosts else None,
        nnodes=1 + len(spec.members) if mp else 1,
        node_rank=node.stage if mp else 0,
        master_addr=spec.host.address if mp else None,
        master_port=(spec.master_port or DEFAULT_MASTER_PORT) if mp else None,
        headless=member is not None,
    )


def redact_argv(argv: list[str], secret: str) -> list[str]:
    """The command line as shown in the console: the engine key replaced."""
    return ["[engine key]" if part == secret else part for part in argv]


def installed_version(package: str) -> str | None:
    """The version of `package` in the agent's interpreter (the one engines run with), or None."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


# Environment variables whose values are secrets: recorded by name only.
_SECRET_ENV = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)
# The simulator's version string (vllm_sim/server.py VERSION), recorded for simulated engines.
SIMULATED_VLLM_VERSION = "0.28.0.dev0+sim"
# The package each engine kind runs as, whose version the agent reports at each heartbeat: the key of
# agent_info that holds it. llama.cpp runs as llama-cpp-python's server, so its version is that package's.
ENGINE_VERSION_KEYS = {"vllm": "vllm_version", "llamacpp": "llama_cpp_version"}


def launch_record(
    deployment: Deployment, spec: EngineSpec, argv: list[str], env: dict[str, str]
) -> dict[str, Any]:
    """What one launch ran and on what, kept on its DeploymentEvent so any launch can be reproduced.

    The argv has the engine key replaced; env values whose names look secret are replaced too. The
    engine's own version (vLLM, or llama-cpp-python for llama.cpp), the vLLM, driver and CUDA versions are
    those the host's agent reported at its last heartbeat (NVML); `simulated` marks a simulated engine or
    simulated GPUs, whose versions are not a real stack's.
    """
    info = deployment.host.agent_info or {}
    simulated_engine = deployment.engine == "sim"
    simulated_gpus = bool(info.get("simulated_gpus", not info.get("nvml", False)))
    version_key = ENGINE_VERSION_KEYS.get(deployment.engine)
    return {
        "engine": deployment.engine,
        "engine_version": (
            SIMULATED_VLLM_VERSION if simulated_engine else info.get(version_key) if version_key else None
        ),
        "vllm_version": SIMULATED_VLLM_VERSION if simulated_engine else info.get("vllm_version"),
        "driver_version": info.get("driver_version"),
        "cuda_driver_version": info.get("cuda_driver_version"),
        "simulated": simulated_engine or simulated_gpus,
        "simulated_engine": simulated_engine,
        "simulated_gpus": simulated_gpus,
        "manifest_digest": deployment.model_version.manifest_digest,
        "model_version": str(deployment.model_version),
        "env": {
            name: ("[redacted]" if _SECRET_ENV.search(name) else value) for name, value in sorted(env.items())
        },
        "argv": redact_argv(argv, spec.api_key),
    }


def new_start_token() -> str:
    return secrets.token_hex(16)


def record_heartbeat(host_name: str, agent_info: dict[str, Any]) -> Host:
    """The agent is alive: stamp the host, and bring it back online if it was unreachable."""
    now = timezone.now()
    with transaction.atomic():
        host = Host.objects.select_for_update().get(name=host_name)
        was = host.state
        host.last_heartbeat = now
        host.agent_info = agent_info
        if host.state in (HostState.UNKNOWN, HostState.UNREACHABLE):
            host.state = HostState.ONLINE
        # `state` only when it changed: a write of the heartbeat fields alone bumps no agent generation.
        fields = ["last_heartbeat", "agent_info", "updated_at"] + (["state"] if was != host.state else [])
        host.save(update_fields=fields)
        if was != host.state:
            publish_config_change("host", name=host.name, state=host.state)
            event = {"type": "host.state", "host": host.name, "state": host.state, "ts": time.time()}
            transaction.on_commit(lambda: push_event([FLEET_GROUP, host_group(host_name)], event))
    return host


def report_gpus(host: Host, gpus: list[dict[str, Any]]) -> None:
    """Replace the host's GPU inventory with what the agent sees (NVML, or simulated GPUs)."""
    now = timezone.now()
    with transaction.atomic():
        seen = []
        for gpu in gpus:
            Gpu.objects.update_or_create(
                host=host,
                index=int(gpu["index"]),
                defaults={
                    "uuid": str(gpu.get("uuid", "")),
                    "name": str(gpu.get("name", "")),
                    "memory_total_bytes": int(gpu.get("memory_total_bytes", 0)),
                    "simulated": bool(gpu.get("simulated", False)),
                    "last_seen": now,
                },
            )
            seen.append(int(gpu["index"]))
        Gpu.objects.filter(host=host).exclude(index__in=seen).delete()
