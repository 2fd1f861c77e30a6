"""Domain logic of the nodes app shared by the API, the Celery tasks and the agent.

- `engine_api_key`: the per-deployment engine key (derived, never stored), for the agent and the proxy.
- `preflight`: every check that refuses a deployment before anything starts, with a clear message.
- `transition`: the one place a deployment's state changes (history row, config-change pub/sub,
  live push to the browser).
- desired-state actions (deploy, start, stop, restart, drain) that enqueue work on the host's queue.
- host heartbeats and the unreachable sweep.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from console.consumers import FLEET_GROUP, deployment_group, host_group
from console.redis_client import get_redis, key, publish_config_change
from nodes.choices import ACTIVE_STATES, DeploymentState, DesiredState, Engine, HostState
from nodes.conf import node_setting
from nodes.engines import EngineSpec, get_adapter
from nodes.engines import vllm as vllm_adapter
from nodes.engines.base import reserved_flags_in
from nodes.models import Deployment, DeploymentEvent, Gpu, Host

log = logging.getLogger(__name__)

GIB = 1024**3


# --- the engine API key -------------------------------------------------------------------------


def engine_api_key(deployment: Deployment) -> str:
    """The key this deployment's engine accepts on /v1; the proxy computes the same value.

    HMAC of the deployment id and its current start token, so it changes at every launch and a
    client that learned an old one (or the engine port) cannot bypass the proxy for long.
    """
    message = f"engine:{deployment.pk}:{deployment.start_token}".encode()
    return hmac.new(settings.API_KEY_HMAC_SECRET.encode(), message, hashlib.sha256).hexdigest()


# --- live values in Redis -----------------------------------------------------------------------


def live_deployment_key(deployment_id: int) -> str:
    return key("live", "deployment", str(deployment_id))


def live_gpu_key(host_name: str, index: int) -> str:
    return key("live", "gpu", host_name, str(index))


def read_live(redis_key: str) -> dict[str, Any] | None:
    """A live JSON value from Redis, or None when absent, expired or Redis is down."""
    try:
        raw = get_redis().get(redis_key)
    except Exception:  # redis errors must never break a page that only decorates with live data
        return None
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def read_live_many(redis_keys: list[str]) -> dict[str, dict[str, Any]]:
    """Several live values in one round trip (MGET); absent, expired or unreadable ones are left out."""
    if not redis_keys:
        return {}
    try:
        raws = get_redis().mget(redis_keys)
    except Exception:  # see read_live
        return {}
    out: dict[str, dict[str, Any]] = {}
    for redis_key, raw in zip(redis_keys, raws, strict=True):
        if raw is None:
            continue
        try:
            value = json.loads(raw)
        except ValueError:
            continue
        if isinstance(value, dict):
            out[redis_key] = value
    return out


SERVING_STATES = frozenset({DeploymentState.READY, DeploymentState.DEGRADED})


def _forget_live(deployment_id: int) -> None:
    try:
        get_redis().delete(live_deployment_key(deployment_id))
    except Exception as exc:  # it expires by its TTL anyway
        log.warning("could not drop live state of deployment %s: %s", deployment_id, exc)


def push_event(groups: list[str], event: dict[str, Any]) -> None:
    """Push one event to browser groups; a Channels/Redis hiccup is logged, never raised."""
    from console.live import push_live_event

    for group in groups:
        try:
            push_live_event(group, event)
        except Exception as exc:  # the live feed is best-effort; the database stays the truth
            log.warning("live push to %s failed: %s", group, exc)


# --- state transitions --------------------------------------------------------------------------


def transition(
    deployment: Deployment,
    to_state: str,
    message: str = "",
    *,
    log_tail: str = "",
    **fields: Any,
) -> Deployment:
    """Move `deployment` to `to_state` (with extra field updates), record it and tell everyone.

    Writes a DeploymentEvent, publishes a config change so proxies refresh their endpoints, and
    pushes the new state to the fleet, host and deployment live groups after commit.
    """
    with transaction.atomic():
        locked = Deployment.objects.select_for_update().select_related("host").get(pk=deployment.pk)
        from_state = locked.state
        changed = from_state != to_state
        locked.state = to_state
        if changed:
            locked.state_changed_at = timezone.now()
        if message or changed:
            locked.state_reason = message
        if log_tail:
            locked.last_log_lines = log_tail
        for name, value in fields.items():
            setattr(locked, name, value)
        locked.save()
        if changed or log_tail or message:
            DeploymentEvent.objects.create(
                deployment=locked,
                from_state=from_state,
                to_state=to_state,
                message=message,
                log_tail=log_tail,
            )
        if changed:
            publish_config_change("deployment", id=locked.pk, state=to_state)
            event = {
                "type": "deployment.state",
                "deployment_id": locked.pk,
                "host": locked.host.name,
                "state": to_state,
                "from_state": from_state,
                "reason": message,
                "ts": time.time(),
            }
            groups = [FLEET_GROUP, host_group(locked.host.name), deployment_group(locked.pk)]
            transaction.on_commit(lambda: push_event(groups, event))
            if to_state not in SERVING_STATES:
                # Live numbers of an engine that no longer serves must not outlive it by their TTL.
                transaction.on_commit(lambda: _forget_live(locked.pk))
    for name in ("state", "state_changed_at", "state_reason", "last_log_lines", *fields):
        setattr(deployment, name, getattr(locked, name))
    return deployment


def record_event(deployment: Deployment, message: str, *, log_tail: str = "") -> None:
    """A history entry that is not a state change (an action, a refusal, a probe note)."""
    DeploymentEvent.objects.create(
        deployment=deployment,
        from_state=deployment.state,
        to_state=deployment.state,
        message=message,
        log_tail=log_tail,
    )


# --- pre-launch checks --------------------------------------------------------------------------


@dataclass
class Preflight:
    """The outcome of checking a deployment before launch: field errors and the fit check."""

    errors: dict[str, list[str]] = field(default_factory=dict)
    fit: Any = None  # models_registry FitResult, when a fit check ran

    @property
    def ok(self) -> bool:
        return not self.errors

    def add(self, name: str, message: str) -> None:
        self.errors.setdefault(name, []).append(message)

    def summary(self) -> str:
        return " ".join(f"{name}: {' '.join(msgs)}" for name, msgs in self.errors.items())


def host_is_reachable(host: Host) -> bool:
    """Fresh heartbeat and not marked unreachable; computed from the timestamp, not a stale flag."""
    if host.last_heartbeat is None or host.state == HostState.UNREACHABLE:
        return False
    age = (timezone.now() - host.last_heartbeat).total_seconds()
    return age <= node_setting("NODE_UNREACHABLE_SECONDS")


def vllm_quantization_method(method: str | None) -> str | None:
    """The `--quantization` value for a registry QuantizationConfig.method (None: read the checkpoint)."""
    if not method or method in ("none", "fp16", "bf16", "int8"):
        # int8 checkpoints name their scheme (compressed-tensors, ...) in their own config.
        return None
    return method


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


def _gpu_reservations(
    host: Host, gpu_indices: list[int], exclude_id: int | None
) -> dict[int, list[tuple[str, float]]]:
    """For each GPU index, the (deployment name, gpu_memory_utilization) of others that hold it."""
    others = Deployment.objects.filter(host=host, state__in=ACTIVE_STATES).exclude(
        desired_state=DesiredState.STOPPED, state=DeploymentState.STOPPED
    )
    if exclude_id is not None:
        others = others.exclude(pk=exclude_id)
    held: dict[int, list[tuple[str, float]]] = {i: [] for i in gpu_indices}
    for other in others:
        for index in other.gpu_indices or []:
            if index in held:
                held[index].append((other.name, other.gpu_memory_utilization))
    return held


def preflight(
    *,
    model_version: Any,
    quantization: Any,
    engine: str,
    host: Host,
    gpu_indices: list[int],
    gpu_memory_utilization: float,
    max_model_len: int,
    block_size: int,
    max_num_seqs: int,
    max_num_batched_tokens: int | None,
    tensor_parallel_size: int,
    extra_args: list[str],
    port: int,
    exclude_id: int | None = None,
    check_reachable: bool = True,
) -> Preflight:
    """Every check that must pass before an engine starts. Nothing is started or written here.

    Refuses: a version that failed verification or whose files do not suit the engine, an
    unreachable or draining host, a port another deployment holds, GPUs that do not exist or
    are already reserved, parameters vLLM would reject, and combinations the registry's fit
    check says do not fit in GPU memory.
    """
    from models_registry.choices import SourceKind, VersionState
    from models_registry.services import state_on_host

    result = Preflight()
    try:
        get_adapter(engine)
    except ValueError as exc:
        result.add("engine", str(exc))
        return result

    # The version's files on this host: a failure on another host says nothing about this one.
    if state_on_host(model_version, host.name) == VersionState.FAILED:
        result.add(
            "model_version",
            f"{model_version} failed file verification on {host.name}; "
            "re-verify it (or fix its files) before deploying there.",
        )
    if engine == Engine.LLAMACPP and model_version.source_kind != SourceKind.GGUF:
        result.add("engine", "llama.cpp serves GGUF files only; this version is a directory.")
    if engine == Engine.VLLM and model_version.source_kind == SourceKind.GGUF:
        result.add(
            "engine", "vLLM no longer loads GGUF in-tree (removed upstream); deploy GGUF with llama.cpp."
        )
    max_context = model_version.max_context
    if max_context is not None and max_model_len > max_context:
        result.add(
            "max_model_len",
            f"{max_model_len:,} exceeds the model's maximum context of {max_context:,} tokens "
            "(vLLM refuses to start with it).",
        )

    # The host.
    if check_reachable and not host_is_reachable(host):
        seen = host.last_heartbeat.isoformat() if host.last_heartbeat else "never"
        result.add(
            "host",
            f"Host {host.name} is unreachable (last heartbeat: {seen}); start its agent "
            f"(manage.py run_agent {host.name}) or pick another host.",
        )
    if host.state == HostState.DRAINING:
        result.add("host", f"Host {host.name} is draining and accepts no new deployments.")
    holders = Deployment.objects.filter(host=host, port=port, state__in=ACTIVE_STATES)
    if exclude_id is not None:
        holders = holders.exclude(pk=exclude_id)
    port_holder = holders.first()
    if port_holder is not None:
        result.add("port", f"Port {port} on {host.name} is used by deployment '{port_holder.name}'.")

    # Engine parameters vLLM validates at start-up.
    if not 0 < gpu_memory_utilization <= 1:
        result.add("gpu_memory_utilization", "Must be greater than 0 and at most 1.")
    if block_size <= 0 or block_size & (block_size - 1):
        result.add("block_size", "Must be a positive power of two (vLLM's attention kernels need it).")
    if max_num_seqs <= 0:
        result.add("max_num_seqs", "Must be positive.")
    if max_num_batched_tokens is not None and max_num_batched_tokens < max_num_seqs:
        result.add(
            "max_num_batched_tokens",
            f"vLLM requires max_num_batched_tokens ({max_num_batched_tokens}) >= max_num_seqs "
            f"({max_num_seqs}).",
        )
    if not isinstance(extra_args, list) or not all(isinstance(a, str) for a in extra_args):
        result.add("extra_args", "Must be a list of strings.")
    else:
        reserved = reserved_flags_in(extra_args)
        if reserved:
            result.add(
                "extra_args",
                f"{', '.join(sorted(set(reserved)))} are set by the console (key, port and name) and "
                "cannot be overridden.",
            )

    quant_method = getattr(quantization, "method", None)
    if engine in (Engine.VLLM, Engine.SIM) and quantization is not None:
        method = vllm_quantization_method(quant_method)
        if quant_method and quant_method.startswith("gguf"):
            result.add("quantization", "GGUF quantizations run on llama.cpp, not vLLM.")
        elif method is not None and method not in vllm_adapter.QUANTIZATION_METHODS:
            result.add("quantization", f"vLLM has no quantization method {method!r}.")
        try:
            vllm_kv_cache_dtype(getattr(quantization, "kv_cache_dtype", None))
        except ValueError as exc:
            result.add("quantization", str(exc))

    # GPUs: they must exist on the host, match the tensor-parallel size and have memory left.
    if engine == Engine.LLAMACPP:
        if gpu_indices:
            result.add("gpu_indices", "llama.cpp engines run on CPU nodes; leave GPUs empty.")
        return result
    if not gpu_indices:
        result.add("gpu_indices", f"Pick at least one GPU of {host.name}.")
        return result
    if len(set(gpu_indices)) != len(gpu_indices):
        result.add("gpu_indices", "A GPU is listed twice.")
    if tensor_parallel_size != len(gpu_indices):
        result.add(
            "tensor_parallel_size",
            f"Must equal the number of GPUs ({len(gpu_indices)}); vLLM shards the model over exactly "
            "tensor_parallel_size visible GPUs.",
        )
    gpus = {g.index: g for g in Gpu.objects.filter(host=host, index__in=gpu_indices)}
    missing = [i for i in gpu_indices if i not in gpus]
    if missing:
        known = sorted(Gpu.objects.filter(host=host).values_list("index", flat=True))
        result.add(
            "gpu_indices",
            f"{host.name} has no GPU {', '.join(map(str, missing))} (its agent reports {known or 'none'}).",
        )
        return result
    for index, gpu_holders in _gpu_reservations(host, gpu_indices, exclude_id).items():
        taken = sum(util for _, util in gpu_holders)
        if taken + gpu_memory_utilization > 1.0 + 1e-9:
            names = ", ".join(f"'{name}' ({util:.0%})" for name, util in gpu_holders)
            left = max(0.0, 1.0 - taken)
            result.add(
                "gpu_indices",
                f"GPU {index} on {host.name} is already taken: {names} reserve {taken:.0%} of its memory. "
                f"Lower gpu_memory_utilization to at most {left:.2f} or pick another GPU.",
            )
    if result.errors:
        return result

    from models_registry.services import fit_check

    gpu_memory_bytes = sum(gpus[i].memory_total_bytes for i in gpu_indices)
    try:
        fit = fit_check(
            model_version,
            quantization,
            gpu_memory_bytes,
            gpu_memory_utilization,
            max_model_len,
            max_num_seqs,
            other_reserved_bytes=0,
        )
    except ValueError as exc:
        result.add("model_version", f"The fit check could not run: {exc}")
        return result
    result.fit = fit
    if not fit.fits:
        result.add("fit", fit.reason)
    return result


def preflight_deployment(deployment: Deployment, *, check_reachable: bool = True) -> Preflight:
    return preflight(
        model_version=deployment.model_version,
        quantization=deployment.quantization or deployment.model_version.quantization,
        engine=deployment.engine,
        host=deployment.host,
        gpu_indices=list(deployment.gpu_indices or []),
        gpu_memory_utilization=deployment.gpu_memory_utilization,
        max_model_len=deployment.max_model_len,
        block_size=deployment.block_size,
        max_num_seqs=deployment.max_num_seqs,
        max_num_batched_tokens=deployment.max_num_batched_tokens,
        tensor_parallel_size=deployment.tensor_parallel_size,
        extra_args=list(deployment.extra_args or []),
        port=deployment.port,
        exclude_id=deployment.pk,
        check_reachable=check_reachable,
    )


# --- command lines ------------------------------------------------------------------------------


def bind_host_for(host: Host) -> str:
    """Engines on a loopback-addressed host listen on loopback only; others on all interfaces."""
    return "127.0.0.1" if host.address in ("127.0.0.1", "localhost", "::1") else "0.0.0.0"


def engine_spec(deployment: Deployment, *, python: str | None = None) -> EngineSpec:
    """The adapter input for `deployment`, with its current engine API key."""
    import sys

    # No quantization on the deployment means the version's own (or the checkpoint as it is).
    quant = deployment.quantization or deployment.model_version.quantization
    method = getattr(quant, "method", None)
    return EngineSpec(
        model_path=deployment.model_version.source_path,
        served_model_name=deployment.served_model_name,
        port=deployment.port,
        api_key=engine_api_key(deployment),
        bind_host=bind_host_for(deployment.host),
        quantization_method=vllm_quantization_method(method),
        kv_cache_dtype=vllm_kv_cache_dtype(getattr(quant, "kv_cache_dtype", None)),
        dtype=vllm_dtype(method),
        gpu_indices=tuple(deployment.gpu_indices or ()),
        gpu_memory_utilization=deployment.gpu_memory_utilization,
        max_model_len=deployment.max_model_len,
        block_size=deployment.block_size,
        max_num_seqs=deployment.max_num_seqs,
        max_num_batched_tokens=deployment.max_num_batched_tokens,
        tensor_parallel_size=deployment.tensor_parallel_size,
        enable_prefix_caching=deployment.enable_prefix_caching,
        extra_args=tuple(deployment.extra_args or ()),
        python=python or sys.executable,
    )


def redact_argv(argv: list[str], secret: str) -> list[str]:
    """The command line as shown in the console: the engine key replaced."""
    return ["[engine key]" if part == secret else part for part in argv]


# --- desired-state actions (API side) -----------------------------------------------------------


def _enqueue(task_name: str, deployment: Deployment, **kwargs: Any) -> None:
    from console.celery import enqueue_on_commit
    from nodes import tasks

    task = getattr(tasks, task_name)
    enqueue_on_commit(task, deployment.pk, queue=deployment.host.agent_queue, **kwargs)


def new_start_token() -> str:
    return secrets.token_hex(16)


def request_start(deployment: Deployment, message: str = "Start requested.") -> Deployment:
    """Ask the host's agent to (re)launch the deployment; a fresh start resets its failure count."""
    with transaction.atomic():
        Deployment.objects.filter(pk=deployment.pk).update(
            desired_state=DesiredState.RUNNING, restart_count=0, next_restart_at=None
        )
        deployment.desired_state = DesiredState.RUNNING
        deployment.restart_count = 0
        if deployment.state in (DeploymentState.STOPPED, DeploymentState.FAILED, DeploymentState.CRASHED):
            transition(deployment, DeploymentState.PENDING, message)
        else:
            record_event(deployment, message)
        _enqueue("launch_deployment", deployment)
    return deployment


def request_stop(deployment: Deployment, *, drain: bool = False) -> Deployment:
    """Ask the agent to stop the engine; with drain, it first waits for in-flight requests to finish."""
    with transaction.atomic():
        Deployment.objects.filter(pk=deployment.pk).update(desired_state=DesiredState.STOPPED)
        deployment.desired_state = DesiredState.STOPPED
        if deployment.state in (DeploymentState.FAILED, DeploymentState.PENDING) and not deployment.pid:
            transition(deployment, DeploymentState.STOPPED, "Stopped before an engine was running.")
        elif deployment.state != DeploymentState.STOPPED:
            transition(
                deployment,
                DeploymentState.STOPPING,
                "Draining: no new requests; stopping when in-flight ones finish."
                if drain
                else "Stop requested.",
            )
        _enqueue("stop_deployment", deployment, drain=drain)
    return deployment


def request_restart(deployment: Deployment) -> Deployment:
    with transaction.atomic():
        Deployment.objects.filter(pk=deployment.pk).update(
            desired_state=DesiredState.RUNNING, restart_count=0, next_restart_at=None
        )
        deployment.desired_state = DesiredState.RUNNING
        record_event(deployment, "Restart requested.")
        _enqueue("restart_deployment", deployment)
    return deployment


# --- hosts: heartbeats and GPUs -----------------------------------------------------------------


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
        host.save(update_fields=["last_heartbeat", "agent_info", "state", "updated_at"])
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


def set_host_draining(host: Host, draining: bool) -> Host:
    """Draining: the host takes no new deployments (preflight refuses them); its engines keep serving."""
    with transaction.atomic():
        locked = Host.objects.select_for_update().get(pk=host.pk)
        if draining:
            locked.state = HostState.DRAINING
        elif locked.state == HostState.DRAINING:
            locked.state = HostState.ONLINE if host_is_reachable(locked) else HostState.UNREACHABLE
        locked.save(update_fields=["state", "updated_at"])
        publish_config_change("host", name=locked.name, state=locked.state)
    host.state = locked.state
    return host


def mark_unreachable_hosts() -> list[str]:
    """Mark hosts whose last heartbeat is older than NODE_UNREACHABLE_SECONDS; returns their names.

    Their ready engines become degraded (the proxy stops preferring them); the agent puts them back
    once heartbeats resume and its probes pass.
    """
    cutoff = timezone.now() - timedelta(seconds=node_setting("NODE_UNREACHABLE_SECONDS"))
    stale = Host.objects.filter(
        Q(last_heartbeat__lt=cutoff), ~Q(state__in=[HostState.UNREACHABLE, HostState.UNKNOWN])
    )
    names = []
    for host in stale:
        with transaction.atomic():
            updated = Host.objects.filter(pk=host.pk, last_heartbeat__lt=cutoff).exclude(
                state=HostState.UNREACHABLE
            )
            if not updated.update(state=HostState.UNREACHABLE):
                continue
            names.append(host.name)
            publish_config_change("host", name=host.name, state=HostState.UNREACHABLE)
            seen = host.last_heartbeat.isoformat() if host.last_heartbeat else "never"
            for deployment in Deployment.objects.filter(
                host=host, state__in=[DeploymentState.READY, DeploymentState.STARTING]
            ):
                transition(
                    deployment,
                    DeploymentState.DEGRADED,
                    f"Host {host.name} missed heartbeats (last {seen}); engine state unknown.",
                )
            event = {
                "type": "host.state",
                "host": host.name,
                "state": HostState.UNREACHABLE,
                "ts": time.time(),
            }
            groups = [FLEET_GROUP, host_group(host.name)]
            transaction.on_commit(lambda g=groups, e=event: push_event(g, e))  # type: ignore[misc]
    return names
