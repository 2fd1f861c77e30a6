"""DeploySpec: what to run where, one typed object carried from the API through the checks to the adapter."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from django.db import models

from models_registry.models import ModelVersion, QuantizationConfig
from nodes.choices import Engine
from nodes.models import Deployment, Host


@dataclass(frozen=True)
class StageHost:
    """One further host of a deployment that spans hosts: its pipeline stage and the GPUs it gives."""

    host: Host
    gpu_indices: tuple[int, ...]
    stage: int


def default_tensor_parallel_size(
    engine: str, gpu_indices: tuple[int, ...] | list[int], pipeline_parallel_size: int = 1
) -> int:
    """vLLM shards over every GPU it is given (tensor x pipeline); llama.cpp runs on CPU nodes, so 1."""
    if engine == Engine.LLAMACPP:
        return 1
    return max(1, len(gpu_indices) // max(1, pipeline_parallel_size))


def _field_default(name: str) -> Any:
    field = Deployment._meta.get_field(name)
    return field.get_default() if isinstance(field, models.Field) else None


@dataclass(frozen=True)
class DeploySpec:
    """A deployment's engine parameters, as they are checked (preflight) and launched (EngineSpec).

    `quantization` is the effective one: the deployment's own, else the version's (None: the
    checkpoint as it is). Defaults are the Deployment model's, so a spec and a new row agree; None
    in gpu_memory_utilization, block_size or max_num_seqs means "vLLM's default" (flag omitted).
    `quantization_override` is a `--quantization` value the admin forces ("": vLLM reads the
    checkpoint's quantization_config).
    """

    model_version: ModelVersion
    quantization: QuantizationConfig | None
    engine: str
    host: Host
    port: int
    gpu_indices: tuple[int, ...]
    gpu_memory_utilization: float | None
    max_model_len: int
    block_size: int | None
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    tensor_parallel_size: int
    enable_prefix_caching: bool
    extra_args: tuple[str, ...]
    pipeline_parallel_size: int = 1
    quantization_override: str = ""
    # Hosts of stages 1..PP-1 when the deployment spans hosts (the head, `host`, is stage 0).
    members: tuple[StageHost, ...] = ()
    ray_port: int | None = None
    # Across hosts: "ray" (a Ray cluster) or "mp" (vLLM's --nnodes launch, the head's master_port).
    multi_host_backend: str = "ray"
    master_port: int | None = None

    @property
    def spans_hosts(self) -> bool:
        return bool(self.members)

    @property
    def uses_ray(self) -> bool:
        """Spans hosts on a Ray cluster (the agents start Ray nodes before the engine)."""
        return self.spans_hosts and self.multi_host_backend != "mp"

    @property
    def uses_mp(self) -> bool:
        """Spans hosts with vLLM's multiprocessing executor: every host runs `vllm serve` itself."""
        return self.spans_hosts and self.multi_host_backend == "mp"

    def stage_hosts(self) -> list[StageHost]:
        """Every stage's host and GPUs, the head first."""
        return [StageHost(self.host, self.gpu_indices, 0), *sorted(self.members, key=lambda m: m.stage)]

    @classmethod
    def from_values(cls, values: Mapping[str, Any], instance: Deployment | None = None) -> DeploySpec:
        """A spec from API input: each parameter from `values`, else from `instance`, else the default.

        A missing `tensor_parallel_size` means the GPUs over the pipeline stages (see
        default_tensor_parallel_size).
        """

        def value(name: str) -> Any:
            if name in values:
                return values[name]
            if instance is not None:
                return getattr(instance, name)
            return _field_default(name)

        version: ModelVersion = value("model_version")
        engine = value("engine")
        gpu_indices = tuple(value("gpu_indices") or ())
        given = "tensor_parallel_size" in values or instance is not None
        tp = value("tensor_parallel_size") if given else None
        members = tuple(_members(values, instance))
        # Across hosts, one pipeline stage per host unless said otherwise.
        pp_given = "pipeline_parallel_size" in values or instance is not None
        pp = (value("pipeline_parallel_size") if pp_given else None) or (1 + len(members))
        if tp is None:
            # Spanning hosts, each host gives tensor_parallel_size GPUs (one pipeline stage per host).
            tp = (
                max(1, len(gpu_indices)) if members else default_tensor_parallel_size(engine, gpu_indices, pp)
            )
        return cls(
            model_version=version,
            quantization=value("quantization") or version.quantization,
            engine=engine,
            host=value("host"),
            port=value("port"),
            gpu_indices=gpu_indices,
            gpu_memory_utilization=value("gpu_memory_utilization"),
            max_model_len=value("max_model_len"),
            block_size=value("block_size"),
            max_num_seqs=value("max_num_seqs"),
            max_num_batched_tokens=value("max_num_batched_tokens"),
            tensor_parallel_size=tp,
            enable_prefix_caching=value("enable_prefix_caching"),
            extra_args=tuple(value("extra_args") or ()),
            pipeline_parallel_size=pp,
            quantization_override=value("quantization_override") or "",
            members=members,
            ray_port=value("ray_port"),
            multi_host_backend=value("multi_host_backend") or "ray",
            master_port=value("master_port"),
        )

    @classmethod
    def from_deployment(cls, deployment: Deployment) -> DeploySpec:
        """The spec a stored deployment runs with."""
        names = {f.name for f in fields(cls)} - {"quantization", "members"}
        values = {name: getattr(deployment, name) for name in names}
        values["quantization"] = deployment.quantization
        values["members"] = stored_members(deployment)
        return cls.from_values(values)


def stored_members(deployment: Deployment) -> list[StageHost]:
    if deployment.pk is None:
        return []
    return [
        StageHost(m.host, tuple(m.gpu_indices or ()), m.stage)
        for m in deployment.members.select_related("host").order_by("stage")
    ]


def _members(values: Mapping[str, Any], instance: Deployment | None) -> list[StageHost]:
    """Members from API input: StageHost objects, or {"host": Host, "gpu_indices": [...]} in stage order."""
    if "members" not in values:
        return stored_members(instance) if instance is not None else []
    members = []
    for stage, item in enumerate(values["members"] or (), start=1):
        if isinstance(item, StageHost):
            members.append(item)
        else:
            members.append(StageHost(item["host"], tuple(item.get("gpu_indices") or ()), stage))
    return members
