"""Every check that refuses a deployment before anything starts, with a message that says what to change.

The API runs it on create and in the deploy wizard; the agent runs it again before each launch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from django.db.models import Q

from models_registry import store as model_store
from models_registry.choices import SourceKind, VersionState
from models_registry.estimate import DEFAULT_OVERHEAD_BYTES, VLLM_DEFAULT_GPU_MEMORY_UTILIZATION, FitResult
from models_registry.services import fit_check, state_on_host
from nodes.choices import ACTIVE_STATES, DeploymentState, DesiredState, Engine, HostState, MultiHostBackend
from nodes.engines import get_adapter
from nodes.engines import vllm as vllm_adapter
from nodes.engines.base import reserved_flags_in
from nodes.lifecycle import host_is_reachable
from nodes.models import DEFAULT_MASTER_PORT, DEFAULT_RAY_PORT, Deployment, DeploymentMember, Gpu, Host
from nodes.spec import DeploySpec, StageHost

SPANNING_ENGINES = (
    "Only vLLM engines (and the simulator) span hosts, on a Ray cluster or with vLLM's multiprocessing "
    "executor (multi_host_backend)."
)


@dataclass
class Preflight:
    """The outcome of checking a deployment before launch: field errors and the fit check."""

    errors: dict[str, list[str]] = field(default_factory=dict)
    fit: FitResult | None = None  # when a fit check ran

    @property
    def ok(self) -> bool:
        return not self.errors

    def add(self, name: str, message: str) -> None:
        self.errors.setdefault(name, []).append(message)

    def summary(self) -> str:
        return " ".join(f"{name}: {' '.join(msgs)}" for name, msgs in self.errors.items())


def vllm_quantization_method(method: str | None) -> str | None:
    """The `--quantization` value for a registry QuantizationConfig.method (None: read the checkpoint)."""
    if not method or method in ("none", "fp16", "bf16", "int8"):
        # int8 checkpoints name their scheme (compressed-tensors, ...) in their own config.
        return None
    return method


def vllm_quantization_flag(spec: DeploySpec) -> str | None:
    """The `--quantization` to pass, or None to let vLLM read the checkpoint's quantization_config.

    A pre-quantized checkpoint (the quantization is the version's own) gets no flag: vLLM then
    upgrades AWQ/GPTQ to its Marlin kernels where the GPU supports them, which it does only when
    the method is not forced (override_quantization_method in vLLM's awq_marlin.py/gptq_marlin.py).
    The flag is passed when the admin forces one (quantization_override) or when the deployment asks
    for a quantization its checkpoint does not carry (online quantization, e.g. fp8 of bf16 weights).
    """
    if spec.quantization_override:
        return spec.quantization_override
    if spec.quantization is None:
        return None
    own = spec.model_version.quantization_id
    if own is not None and spec.quantization.pk == own:
        return None
    return vllm_quantization_method(spec.quantization.method)


def vllm_dtype(method: str | None) -> str | None:
    return {"fp16": "float16", "bf16": "bfloat16"}.get(method or "")


def vllm_kv_cache_dtype(name: str | None) -> str | None:
    """The `--kv-cache-dtype` value for a registry kv_cache_dtype; ValueError if vLLM has none."""
    if not name or name == "auto":
        return None
    mapped = {"fp16": "float16", "bf16": "bfloat16"}.get(name, name)
    if mapped not in vllm_adapter.KV_CACHE_DTYPES:
        raise ValueError(
            f"vLLM has no KV-cache dtype {name!r}; use one of {sorted(vllm_adapter.KV_CACHE_DTYPES)}"
        )
    return mapped


def held_fraction(deployment: Deployment, gpu_total_bytes: int) -> float:
    """The share of one GPU's memory `deployment` holds: its gpu_memory_utilization while awake (vLLM's
    default, 0.92, when unset); asleep, only what sleep mode leaves on the GPU. Level 1 moves the weights
    to host memory and frees the KV cache, level 2 drops both: either way the CUDA context, CUDA graphs
    and activation reserve stay (DEFAULT_OVERHEAD_BYTES, as the fit check counts them)."""
    util = deployment.gpu_memory_utilization
    util = VLLM_DEFAULT_GPU_MEMORY_UTILIZATION if util is None else util
    if deployment.state == DeploymentState.SLEEPING and deployment.sleeping_level >= 1 and gpu_total_bytes:
        return min(util, DEFAULT_OVERHEAD_BYTES / gpu_total_bytes)
    return util


def reservations(
    host_ids: Iterable[int] | None, exclude_id: int | None, totals: Mapping[tuple[int, int], int]
) -> dict[tuple[int, int], list[tuple[str, float]]]:
    """For each (host id, GPU index) others hold, the (deployment name, share of its memory) of each.

    A deployment on vLLM's default reserves what vLLM takes: 0.92; a sleeping one what sleep leaves
    (held_fraction, which needs the GPU's total from `totals`). A deployment spanning hosts holds its
    members' GPUs on their hosts too. `host_ids` None: every host, in the same two queries.
    """
    live = Q(state__in=ACTIVE_STATES) & ~Q(desired_state=DesiredState.STOPPED, state=DeploymentState.STOPPED)
    others = Deployment.objects.filter(live)
    members = DeploymentMember.objects.select_related("deployment")
    members = members.filter(deployment__state__in=ACTIVE_STATES).exclude(
        deployment__desired_state=DesiredState.STOPPED, deployment__state=DeploymentState.STOPPED
    )
    if host_ids is not None:
        others = others.filter(host_id__in=list(host_ids))
        members = members.filter(host_id__in=list(host_ids))
    if exclude_id is not None:
        others = others.exclude(pk=exclude_id)
        members = members.exclude(deployment_id=exclude_id)
    holders = [(other, other.host_id, other.gpu_indices) for other in others]
    holders += [(member.deployment, member.host_id, member.gpu_indices) for member in members]
    held: dict[tuple[int, int], list[tuple[str, float]]] = {}
    for other, host_id, indices in holders:
        asleep = " (asleep)" if other.state == DeploymentState.SLEEPING else ""
        for index in indices or []:
            share = held_fraction(other, totals.get((host_id, index), 0))
            held.setdefault((host_id, index), []).append((other.name + asleep, share))
    return held


def gpu_reservations(
    host: Host, gpu_indices: tuple[int, ...], exclude_id: int | None, totals: dict[int, int] | None = None
) -> dict[int, list[tuple[str, float]]]:
    """For each of `gpu_indices` on `host`, the (deployment name, share of its memory) of others that
    hold it (see `reservations`)."""
    held = reservations([host.pk], exclude_id, {(host.pk, i): t for i, t in (totals or {}).items()})
    return {i: held.get((host.pk, i), []) for i in gpu_indices}


def preflight(spec: DeploySpec, *, exclude_id: int | None = None, check_reachable: bool = True) -> Preflight:
    """Every check that must pass before an engine starts. Nothing is started or written here.

    Refuses: a version that failed verification or whose files do not suit the engine, an
    unreachable or draining host, a port another deployment holds, GPUs that do not exist or
    are already reserved, parameters vLLM would reject, and combinations the registry's fit
    check says do not fit in GPU memory.
    """
    host = spec.host
    result = Preflight()
    try:
        get_adapter(spec.engine)
    except ValueError as exc:
        result.add("engine", str(exc))
        return result

    # The version's files on this host: a failure on another host says nothing about this one.
    if state_on_host(spec.model_version, host.name) == VersionState.FAILED:
        result.add(
            "model_version",
            f"{spec.model_version} failed file verification on {host.name}; "
            "re-verify it (or fix its files) before deploying there.",
        )
    if spec.engine == Engine.LLAMACPP and spec.model_version.source_kind != SourceKind.GGUF:
        result.add("engine", "llama.cpp serves GGUF files only; this version is a directory.")
    if spec.engine == Engine.VLLM and spec.model_version.source_kind == SourceKind.GGUF:
        result.add(
            "engine", "vLLM no longer loads GGUF in-tree (removed upstream); deploy GGUF with llama.cpp."
        )
    max_context = spec.model_version.max_context
    if max_context is not None and spec.max_model_len > max_context:
        result.add(
            "max_model_len",
            f"{spec.max_model_len:,} exceeds the model's maximum context of {max_context:,} tokens "
            "(vLLM refuses to start with it).",
        )

    # The hosts: the head, and each further host when the deployment spans hosts.
    for stage in spec.stage_hosts():
        _check_host(result, stage.host, check_reachable)
    holders = Deployment.objects.filter(host=host, port=spec.port, state__in=ACTIVE_STATES)
    if exclude_id is not None:
        holders = holders.exclude(pk=exclude_id)
    port_holder = holders.first()
    if port_holder is not None:
        result.add("port", f"Port {spec.port} on {host.name} is used by deployment '{port_holder.name}'.")

    # Engine parameters vLLM validates at start-up (None: the flag is omitted, vLLM's default).
    if spec.gpu_memory_utilization is not None and not 0 < spec.gpu_memory_utilization <= 1:
        result.add("gpu_memory_utilization", "Must be greater than 0 and at most 1.")
    if spec.block_size is not None and (spec.block_size <= 0 or spec.block_size & (spec.block_size - 1)):
        result.add("block_size", "Must be a positive power of two (vLLM's attention kernels need it).")
    if spec.max_num_seqs is not None and spec.max_num_seqs <= 0:
        result.add("max_num_seqs", "Must be positive.")
    if spec.pipeline_parallel_size < 1:
        result.add("pipeline_parallel_size", "Must be at least 1.")
    if (
        spec.max_num_batched_tokens is not None
        and spec.max_num_seqs is not None
        and spec.max_num_batched_tokens < spec.max_num_seqs
    ):
        result.add(
            "max_num_batched_tokens",
            f"vLLM requires max_num_batched_tokens ({spec.max_num_batched_tokens}) >= max_num_seqs "
            f"({spec.max_num_seqs}).",
        )
    if not all(isinstance(a, str) for a in spec.extra_args):
        result.add("extra_args", "Must be a list of strings.")
    else:
        reserved = reserved_flags_in(spec.extra_args)
        if reserved:
            result.add(
                "extra_args",
                f"{', '.join(sorted(set(reserved)))} are set by the console (key, port and name) and "
                "cannot be overridden.",
            )
        elif spec.engine in (Engine.VLLM, Engine.SIM):
            prefix = "--sim-" if spec.engine == Engine.SIM else None
            for problem in vllm_adapter.check_extra_args(spec.extra_args, allow_prefix=prefix):
                result.add("extra_args", problem)
    if spec.quantization_override:
        if spec.engine not in (Engine.VLLM, Engine.SIM):
            result.add("quantization_override", "Only vLLM engines take a --quantization method.")
        elif spec.quantization_override not in vllm_adapter.QUANTIZATION_METHODS:
            result.add(
                "quantization_override",
                f"vLLM has no quantization method {spec.quantization_override!r} "
                "(vllm/model_executor/layers/quantization/__init__.py:12-43).",
            )

    quant_method = getattr(spec.quantization, "method", None)
    if spec.engine in (Engine.VLLM, Engine.SIM) and spec.quantization is not None:
        method = vllm_quantization_method(quant_method)
        if quant_method and quant_method.startswith("gguf"):
            result.add("quantization", "GGUF quantizations run on llama.cpp, not vLLM.")
        elif method is not None and method not in vllm_adapter.QUANTIZATION_METHODS:
            result.add("quantization", f"vLLM has no quantization method {method!r}.")
        try:
            vllm_kv_cache_dtype(getattr(spec.quantization, "kv_cache_dtype", None))
        except ValueError as exc:
            result.add("quantization", str(exc))

    # GPUs: they must exist on the host, match the tensor-parallel size and have memory left.
    if spec.engine == Engine.LLAMACPP:
        if spec.gpu_indices:
            result.add("gpu_indices", "llama.cpp engines run on CPU nodes; leave GPUs empty.")
        if spec.members:
            result.add("members", SPANNING_ENGINES)
        return result
    if spec.spans_hosts:
        _check_stages(result, spec, exclude_id)
        _check_model_roots(result, spec)
        if result.errors:
            return result
    elif not spec.gpu_indices:
        result.add("gpu_indices", f"Pick at least one GPU of {host.name}.")
        return result
    else:
        if len(set(spec.gpu_indices)) != len(spec.gpu_indices):
            result.add("gpu_indices", "A GPU is listed twice.")
        world_size = spec.tensor_parallel_size * spec.pipeline_parallel_size
        if world_size != len(spec.gpu_indices):
            result.add(
                "tensor_parallel_size",
                f"tensor_parallel_size x pipeline_parallel_size ({spec.tensor_parallel_size} x "
                f"{spec.pipeline_parallel_size} = {world_size}) must equal the number of GPUs "
                f"({len(spec.gpu_indices)}); vLLM runs one worker per GPU of tensor x pipeline "
                "(world_size, vllm/config/parallel.py), all on this host.",
            )
    stage_gpus: list[tuple[StageHost, dict[int, Gpu]]] = []
    for stage in spec.stage_hosts():
        gpus = _stage_gpus(result, stage, exclude_id, spec.gpu_memory_utilization)
        if gpus is not None:
            stage_gpus.append((stage, gpus))
    if result.errors:
        return result

    # The fit check, per pipeline stage: each host holds 1/PP of the layers (weights) and of the KV
    # cache of every token, so a stage of TP GPUs with memory M fits exactly as PP such stages
    # together would (fit_check's pooled arithmetic on PP x M). vLLM sizes the KV cache by its
    # smallest worker, so the deployment gets the worst stage's figure. On one host every stage
    # shares the host's GPUs and the pooled check is the same as before.
    stages = stage_gpus if spec.spans_hosts else [(stage_gpus[0][0], stage_gpus[0][1])]
    worst: FitResult | None = None
    worst_stage: StageHost | None = None
    for stage, gpus in stages:
        memory = sum(gpus[i].memory_total_bytes for i in stage.gpu_indices)
        try:
            fit = fit_check(
                spec.model_version,
                spec.quantization,
                memory * spec.pipeline_parallel_size if spec.spans_hosts else memory,
                spec.gpu_memory_utilization,
                spec.max_model_len,
                spec.max_num_seqs,
                other_reserved_bytes=0,
                tensor_parallel_size=spec.tensor_parallel_size,
                pipeline_parallel_size=spec.pipeline_parallel_size,
                # vLLM sizes its batch defaults by the first device (current_platform.get_device_name()).
                gpu_name=gpus[stage.gpu_indices[0]].name,
                max_num_batched_tokens=spec.max_num_batched_tokens,
            )
        except ValueError as exc:
            result.add("model_version", f"The fit check could not run: {exc}")
            return result
        if worst is None or (not fit.fits, -fit.kv_tokens_available) > (
            not worst.fits,
            -worst.kv_tokens_available,
        ):
            worst, worst_stage = fit, stage
    assert worst is not None and worst_stage is not None
    if spec.spans_hosts:
        pp = spec.pipeline_parallel_size
        worst.reason = (
            f"Stage {worst_stage.stage} on {worst_stage.host.name} (1/{pp} of the layers and of the KV "
            f"cache on {spec.tensor_parallel_size} GPU(s)): {worst.reason}"
        )
    result.fit = worst
    if not worst.fits:
        result.add("fit", worst.reason)
    return result


def _check_host(result: Preflight, host: Host, check_reachable: bool) -> None:
    if check_reachable and not host_is_reachable(host):
        seen = host.last_heartbeat.isoformat() if host.last_heartbeat else "never"
        result.add(
            "host",
            f"Host {host.name} is unreachable (last heartbeat: {seen}); start its agent "
            f"(manage.py run_agent {host.name}) or pick another host.",
        )
    if host.state == HostState.DRAINING:
        result.add("host", f"Host {host.name} is draining and accepts no new deployments.")


def _check_stages(result: Preflight, spec: DeploySpec, exclude_id: int | None) -> None:
    """A deployment across hosts: one pipeline stage per host, tensor_parallel_size GPUs on each.

    That is vLLM's documented layout for several nodes (tensor parallel inside a node, pipeline
    parallel across nodes, Ray or vLLM's multiprocessing executor; docs/deploying.md, "One model across
    hosts").
    """
    if spec.engine not in (Engine.VLLM, Engine.SIM):
        result.add("members", SPANNING_ENGINES)
        return
    stages = spec.stage_hosts()
    names = [stage.host.name for stage in stages]
    if spec.uses_mp:
        _check_master_port(result, spec, exclude_id)
    else:
        _check_ray_port(result, spec, exclude_id)
    if len(set(names)) != len(names):
        result.add("members", "A host is listed twice; each pipeline stage runs on its own host.")
    if spec.pipeline_parallel_size != len(stages):
        result.add(
            "pipeline_parallel_size",
            f"A deployment across {len(stages)} hosts ({', '.join(names)}) runs one pipeline stage per "
            f"host: pipeline_parallel_size must be {len(stages)}, not {spec.pipeline_parallel_size}.",
        )
    for stage in stages:
        field_name = "gpu_indices" if stage.stage == 0 else "members"
        info = stage.host.agent_info or {}
        if info and info.get("channel") != "api":
            # Only the fleet agent (nodes/agent/remote.py) starts Ray nodes and headless vLLM nodes;
            # the co-located Celery agent would launch an engine with no other hosts to meet.
            result.add(
                field_name,
                f"{stage.host.name} runs the co-located agent, which starts no Ray or headless node; run "
                f"the fleet agent there (python -m nodes.agent --host {stage.host.name}) to deploy across "
                "hosts.",
            )
        if len(set(stage.gpu_indices)) != len(stage.gpu_indices):
            result.add(field_name, f"A GPU of {stage.host.name} is listed twice.")
        if len(stage.gpu_indices) != spec.tensor_parallel_size:
            result.add(
                field_name,
                f"{stage.host.name} gives {len(stage.gpu_indices)} GPU(s); every host of the deployment "
                f"gives tensor_parallel_size ({spec.tensor_parallel_size}) GPUs, one tensor-parallel "
                "group per pipeline stage.",
            )


def _check_ray_port(result: Preflight, spec: DeploySpec, exclude_id: int | None) -> None:
    """The Ray head's port on the head host: not another spanning deployment's head, not the engine's."""
    port = spec.ray_port or DEFAULT_RAY_PORT
    other = _head_on_port(spec, exclude_id, MultiHostBackend.RAY, "ray_port", port, DEFAULT_RAY_PORT)
    if other is not None:
        result.add(
            "ray_port",
            f"Ray port {port} on {spec.host.name} is the head of deployment '{other.name}''s cluster; "
            "pick another ray_port.",
        )
    elif port == spec.port:
        result.add("ray_port", "The Ray head's port cannot be the engine's port.")


def _check_master_port(result: Preflight, spec: DeploySpec, exclude_id: int | None) -> None:
    """The mp backend's --master-port on the head host, where every host's workers meet: not another
    spanning deployment's, not the engine's."""
    port = spec.master_port or DEFAULT_MASTER_PORT
    other = _head_on_port(spec, exclude_id, MultiHostBackend.MP, "master_port", port, DEFAULT_MASTER_PORT)
    if other is not None:
        result.add(
            "master_port",
            f"Master port {port} on {spec.host.name} is where the hosts of deployment '{other.name}' meet; "
            "pick another master_port.",
        )
    elif port == spec.port:
        result.add("master_port", "The master port cannot be the engine's port.")


def _head_on_port(
    spec: DeploySpec, exclude_id: int | None, backend: str, field_name: str, port: int, default: int
) -> Deployment | None:
    """Another active deployment spanning hosts from the same head host with `backend` on `port` (a null
    port field is the default port)."""
    same_port = Q(**{field_name: port})
    if port == default:
        same_port |= Q(**{f"{field_name}__isnull": True})
    heads = Deployment.objects.filter(
        same_port,
        host=spec.host,
        multi_host_backend=backend,
        state__in=ACTIVE_STATES,
        members__isnull=False,
    )
    if exclude_id is not None:
        heads = heads.exclude(pk=exclude_id)
    return heads.distinct().first()


def _check_model_roots(result: Preflight, spec: DeploySpec) -> None:
    """While the files come from the model store, every host of a deployment spanning hosts keeps them
    under the model root its agent reports, and vLLM's Ray workers load the model from the path the
    head's command line names (vLLM's multi-node docs: the same path on every node; with the mp backend
    each host's command line is built from the same path too). So the roots must
    be the same path on every host."""
    if model_store.active_store() is None or not spec.model_version.manifest_digest:
        return
    # Hosts whose agent has not reported yet are left to the reachability check.
    reported = (
        (stage.host.name, (stage.host.agent_info or {}).get("model_root")) for stage in spec.stage_hosts()
    )
    roots = {name: str(root) for name, root in reported if root}
    if len(set(roots.values())) > 1:
        listed = ", ".join(f"{name}: {root}" for name, root in roots.items())
        result.add(
            "members",
            f"The hosts' agents keep model files under different model roots ({listed}); vLLM's Ray "
            "workers load the model from the same path on every host. Start every host's agent with "
            "the same --model-root (INFERCHAIN_MODEL_ROOT).",
        )


def _stage_gpus(
    result: Preflight, stage: StageHost, exclude_id: int | None, utilization: float | None
) -> dict[int, Gpu] | None:
    """The stage's GPUs on its host, after checking they exist and have memory left (None: refused)."""
    host = stage.host
    field_name = "gpu_indices" if stage.stage == 0 else "members"
    gpus = {g.index: g for g in Gpu.objects.filter(host=host, index__in=stage.gpu_indices)}
    missing = [i for i in stage.gpu_indices if i not in gpus]
    if missing:
        known = sorted(Gpu.objects.filter(host=host).values_list("index", flat=True))
        result.add(
            field_name,
            f"{host.name} has no GPU {', '.join(map(str, missing))} (its agent reports {known or 'none'}).",
        )
        return None
    wanted = VLLM_DEFAULT_GPU_MEMORY_UTILIZATION if utilization is None else utilization
    totals = {i: g.memory_total_bytes for i, g in gpus.items()}
    for index, gpu_holders in gpu_reservations(host, stage.gpu_indices, exclude_id, totals).items():
        taken = sum(util for _, util in gpu_holders)
        if taken + wanted > 1.0 + 1e-9:
            names = ", ".join(f"'{name}' ({util:.0%})" for name, util in gpu_holders)
            left = max(0.0, 1.0 - taken)
            result.add(
                field_name,
                f"GPU {index} on {host.name} is already taken: {names} reserve {taken:.0%} of its memory. "
                f"Lower gpu_memory_utilization to at most {left:.2f} or pick another GPU.",
            )
    return gpus


def preflight_deployment(deployment: Deployment, *, check_reachable: bool = True) -> Preflight:
    """The checks again for a stored deployment (the agent runs them before each launch)."""
    return preflight(
        DeploySpec.from_deployment(deployment), exclude_id=deployment.pk, check_reachable=check_reachable
    )
