"""What every engine adapter provides: its command line, its probes and its metrics parser.

Adapters take an `EngineSpec` (plain values, no ORM), so building a command line is a pure
function that tests can check flag by flag.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Protocol

from nodes.engines.metrics import EngineMetrics

# Flags the console owns: an admin's extra_args may not override them, because that would let an
# engine listen without the per-deployment key or under another name than the proxy expects, or (the
# multi-node ones) place its nodes somewhere other than the deployment's hosts.
RESERVED_FLAGS = frozenset(
    {
        "--nnodes",
        "-n",
        "--node-rank",
        "-r",
        "--master-addr",
        "--master-port",
        "--headless",
        "--api-key",
        "--api_key",
        "--port",
        "--host",
        "--served-model-name",
        "--served_model_name",
        "--model_alias",
        "--model-alias",
        "--model",
    }
)


@dataclass(frozen=True)
class EngineSpec:
    """Everything an adapter needs to start one engine."""

    model_path: str
    served_model_name: str
    port: int
    api_key: str
    bind_host: str = "0.0.0.0"
    quantization_method: str | None = None
    kv_cache_dtype: str | None = None
    dtype: str | None = None
    tokenizer_path: str | None = None
    gpu_indices: tuple[int, ...] = ()
    # None: the flag is omitted and the engine uses its own default.
    gpu_memory_utilization: float | None = None
    max_model_len: int = 4096
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    enable_prefix_caching: bool = True
    enable_sleep_mode: bool = False
    extra_args: tuple[str, ...] = field(default_factory=tuple)
    python: str = sys.executable
    # Set when the deployment spans hosts: "ray" or "mp", the Ray head's host:port (Ray), and the IP of
    # the host this command line runs on.
    distributed_executor_backend: str | None = None
    ray_address: str | None = None
    node_ip: str | None = None
    # vLLM's multi-node launch without Ray (mp): node count, this host's rank (0 runs the API server),
    # where the nodes meet, and whether this node runs workers only (`--headless`, ranks 1..N-1).
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    headless: bool = False


class EngineAdapter(Protocol):
    """The interface each module in nodes/engines implements."""

    name: str
    # Liveness: answers 200 while the process serves HTTP (no API key needed).
    health_path: str
    # Readiness: lists the served model name (needs the engine API key).
    models_path: str
    # Prometheus text, or None if the engine has none.
    metrics_path: str | None

    def build_argv(self, spec: EngineSpec) -> list[str]: ...

    def build_env(self, spec: EngineSpec) -> dict[str, str]: ...

    def parse_metrics(self, text: str) -> EngineMetrics: ...


def reserved_flags_in(args: list[str] | tuple[str, ...]) -> list[str]:
    """The console-owned flags an extra_args list tries to set (also in --flag=value form)."""
    found = []
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in RESERVED_FLAGS:
            found.append(flag)
    return found
