"""The bundled vLLM simulator: vLLM's flags and endpoints, no GPU needed.

It takes the same `serve` flags as vLLM, so its command line is vLLM's with a different program;
`--sim-*` options (profile, time scale, failure injection) come from the deployment's extra_args.
"""

from __future__ import annotations

from nodes.engines import vllm
from nodes.engines.base import EngineSpec
from nodes.engines.metrics import EngineMetrics, parse_vllm_metrics

name = "sim"
health_path = "/health"
models_path = "/v1/models"
metrics_path: str | None = "/metrics"
# The simulator's model of the GPU it pretends to run on.
gpu_path = "/sim/gpu"


def build_argv(spec: EngineSpec) -> list[str]:
    argv = [spec.python, "-m", "vllm_sim", "serve", spec.model_path, *vllm.serve_flags(spec)]
    if spec.gpu_indices:
        # The simulator numbers its modelled GPUs from here, so /sim/gpu speaks the host's indices.
        argv += ["--sim-gpu-index", str(spec.gpu_indices[0])]
    return [*argv, *spec.extra_args]


def build_env(spec: EngineSpec) -> dict[str, str]:
    return vllm.build_env(spec)


def parse_metrics(text: str) -> EngineMetrics:
    return parse_vllm_metrics(text)
