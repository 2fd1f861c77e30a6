"""The control plane's side of the agent channel (/api/agent/): what one sync call of a host's agent does.

An agent holds no database credentials. Once per NODE_TELEMETRY_SECONDS it sends one batch: its
heartbeat, its GPU samples and engines' live records, and the state changes it queued (engine
started, ready, degraded, exited, stopped), oldest first. This module applies the changes through
`lifecycle.transition` and `runtime.record_crash` (the same rules as for an agent on the control
plane's own machine), publishes the telemetry to Redis, prepares launches (file check, fit check,
start token, command line) and answers with the deployments the host must run.

Every change is idempotent: it names the deployment and the start token of the engine it is about,
and it applies only while the deployment is in the state it expects, so an agent that replays its
queue after an outage (or retries a batch whose answer it never got) changes nothing twice.

Engine logs stay on the agent's host: the web process asks for a tail through Redis
(`request_log`), the next sync hands the request to the agent, and the agent posts the lines back
(`answer_log`), bounded in lines and bytes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from core.celery import app
from core.redis_client import get_redis, key
from models_registry import store as model_store
from nodes import agent_generation, agent_generation_signals, agent_telemetry
from nodes.agent import runtime
from nodes.agent.model_fetch import fetch_spec, remote_model_path
from nodes.agent.services import bind_host_for, launch_record, record_heartbeat, redact_argv, report_gpus
from nodes.choices import DeploymentState, DesiredState, HostState
from nodes.lifecycle import (
    engine_api_key,
    push_events,
    record_event,
    transition,
    wake_requested,
)
from nodes.models import DEFAULT_RAY_PORT, Deployment, DeploymentMember, Gpu, Host
from nodes.spec import StageHost

log = logging.getLogger("nodes.agent_channel")

# Stands for the agent's own interpreter in a command line the control plane builds.
AGENT_PYTHON = "{agent-python}"
SUPERVISED_STATES = (DeploymentState.STARTING, DeploymentState.READY, DeploymentState.DEGRADED)
# Log tails through the channel: at most this many lines and bytes per answer.
LOG_MAX_LINES = 1000
LOG_MAX_BYTES = 1024 * 1024
LOG_DOWNLOAD_MAX_LINES = 100_000
LOG_DOWNLOAD_MAX_BYTES = 8 * 1024 * 1024
WAKE_TASK = "nodes.wake_deployment"
CHANGE_KINDS = (
    "started",
    "ready",
    "degraded",
    "exited",
    "stopped",
    "failed",
    "ray_lost",
    "member_lost",
    "member_fetch_failed",
    "fetched",
    "relaunched",
)
# A deployment keeps its Ray nodes up in these states (desired running): through a crash's backoff too,
# so the restart finds the cluster there.
RAY_DOWN_STATES = (DeploymentState.STOPPED, DeploymentState.FAILED)
# With the mp backend a member host runs its headless node while the head's engine process runs (one per
# launch): from its start until it has stopped (draining included, the head still needs the workers).
HEADLESS_STATES = (
    DeploymentState.STARTING,
    DeploymentState.READY,
    DeploymentState.DEGRADED,
    DeploymentState.SLEEPING,
    DeploymentState.STOPPING,
)


def uses_agent_channel(host: Host) -> bool:
    """Whether the host's agent reaches the control plane through /api/agent/ (no database access)."""
    return (host.agent_info or {}).get("channel") == "api"


def agent_settings() -> dict[str, Any]:
    """The supervision settings the control plane hands its agents, so they need no settings of their own."""
    return {
        "telemetry_seconds": settings.NODE_TELEMETRY_SECONDS,
        "heartbeat_seconds": settings.NODE_HEARTBEAT_SECONDS,
        "hang_seconds": settings.NODE_HANG_SECONDS,
        "startup_timeout_seconds": settings.NODE_STARTUP_TIMEOUT_SECONDS,
        "stop_timeout_seconds": settings.NODE_STOP_TIMEOUT_SECONDS,
        "log_max_bytes": settings.ENGINE_LOG_MAX_BYTES,
        "log_keep": settings.ENGINE_LOG_KEEP,
        # How the agent restarts an engine that exits while it cannot reach the control plane: the
        # control plane's own backoff and limit (runtime.record_crash).
        "max_restarts": settings.NODE_MAX_RESTARTS,
        "restart_backoff_seconds": settings.NODE_RESTART_BACKOFF_SECONDS,
        "restart_backoff_max_seconds": settings.NODE_RESTART_BACKOFF_MAX_SECONDS,
    }


# --- one sync ---------------------------------------------------------------------------------------


def sync(host: Host, batch: dict[str, Any], *, token_digest: str = "") -> dict[str, Any]:
    """Apply one batch from the host's agent and answer with what it must run.

    The answer carries the host's generation, read before anything else here (agent_generation), and
    leaves the snapshot that lets the ingest answer the next routine syncs without this path.
    """
    generation = agent_generation.current(host.name)
    info = {**batch.get("info", {}), "channel": "api"}
    if _heartbeat_due(host, info):
        host = record_heartbeat(host.name, info)  # the row as written: its state and lease feed the snapshot
    if batch.get("gpu_inventory") is not None:
        report_gpus(host, batch["gpu_inventory"])
    acked = []
    for change in batch.get("changes", []):
        try:
            outcome = apply_change(host, change)
        except Exception:
            # Not acknowledged: the agent sends it again (with the ones after it, kept in order).
            log.exception("agent %s: change %s could not be applied", host.name, change.get("id"))
            break
        log.info(
            "agent %s: %s of deployment %s: %s", host.name, change["kind"], change["deployment_id"], outcome
        )
        acked.append(change["id"])
    record_ray_nodes(host, batch.get("ray_nodes", []))
    deployments = {
        d.pk: d
        for d in Deployment.objects.select_related("host", "model_version", "quantization").filter(host=host)
    }
    gpu_indices = publish_telemetry(
        host, deployments, batch.get("engines", []), batch.get("gpus", []), batch.get("info", {})
    )
    for deployment in deployments.values():
        reconcile(deployment)
    wake_sleepers(host, deployments)
    drains = _drains_requested(list(deployments))
    answer = {
        "acked": acked,
        "generation": generation,
        "settings": agent_settings(),
        "deployments": [describe(d, drain=d.pk in drains) for d in deployments.values()],
        "ray": ray_plans(host, deployments),
        "log_requests": take_log_requests(host.name),
    }
    if token_digest:
        spans = DeploymentMember.objects.filter(Q(deployment__host=host) | Q(host=host)).exists()
        agent_generation.store(
            host.name,
            agent_generation.snapshot_for(
                host,
                deployments.values(),
                gpu_indices,
                generation=generation,
                token_digest=token_digest,
                info=info,
                # Spanning hosts: the answer hangs on other hosts' Ray reports. (A drain or a log request
                # moves the generation itself: the next sync is a full one, which hands it out.)
                always_full=spans,
            ),
        )
    return answer


def apply_change(host: Host, change: dict[str, Any]) -> str:
    """One queued state change of the agent; returns what it did ("applied", "stale", "duplicate")."""
    if change["kind"] in ("ray_lost", "member_lost"):
        return _member_lost(host, change)
    if change["kind"] == "member_fetch_failed":
        return _member_fetch_failed(host, change)
    if change["kind"] == "fetched":
        return _fetched(host, change)
    deployment = (
        Deployment.objects.select_related("host", "model_version", "quantization")
        .filter(pk=change["deployment_id"], host=host)
        .first()
    )
    if deployment is None:
        return "gone"
    if change.get("start_token", "") != deployment.start_token:
        return "stale"  # about an engine of an earlier launch
    kind = change["kind"]
    message = str(change.get("message", ""))[:2000]
    log_tail = str(change.get("log_tail", ""))[-20_000:]
    state = deployment.state
    if kind == "started":
        if state != DeploymentState.VERIFYING or deployment.pid:
            return "duplicate"
        # Recorded with the interpreter the agent runs engines with (it reports it in its info).
        plan = runtime.launch_plan(
            deployment,
            python=str(host_info(host).get("python") or AGENT_PYTHON),
            model_path=remote_model_path(deployment),
        )
        pid = int(change["pid"])
        started = datetime.fromtimestamp(float(change.get("at", time.time())), tz=UTC)
        transition(
            deployment,
            DeploymentState.STARTING,
            f"Engine started (pid {pid}) on {host.name}; waiting for /health and /v1/models.",
            pid=pid,
            launch=launch_record(deployment, plan.spec, plan.argv, plan.env),
            launch_argv=redact_argv(plan.argv, plan.spec.api_key),
            reported_quantization="",
            log_path=str(change.get("log_path", ""))[:500],
            started_at=started,
            ready_at=None,
            next_restart_at=None,
        )
    elif kind == "ready":
        if state == DeploymentState.STARTING:
            transition(
                deployment,
                DeploymentState.READY,
                message,
                ready_at=timezone.now(),
                reported_quantization=str(change.get("kernel", ""))[:64],
            )
        elif state == DeploymentState.DEGRADED:
            # Degraded while starting (the host missed heartbeats) has no ready time yet.
            extra: dict[str, Any] = {} if deployment.ready_at else {"ready_at": timezone.now()}
            transition(deployment, DeploymentState.READY, message or "Recovered: probes pass again.", **extra)
        else:
            return "duplicate"
    elif kind == "degraded":
        if state != DeploymentState.READY:
            return "duplicate"
        transition(deployment, DeploymentState.DEGRADED, message)
    elif kind == "exited":
        if state == DeploymentState.STOPPING:
            transition(
                deployment, DeploymentState.STOPPED, message, log_tail=log_tail, pid=None, ready_at=None
            )
        elif state in SUPERVISED_STATES:
            runtime.record_crash(deployment, message, remote_log_tail=log_tail)
        else:
            return "duplicate"
    elif kind == "stopped":
        if state == DeploymentState.STOPPED and not deployment.pid:
            return "duplicate"
        if deployment.desired_state == DesiredState.RUNNING and state == DeploymentState.STOPPING:
            transition(
                deployment, DeploymentState.PENDING, "Restart: launching again.", log_tail=log_tail, pid=None
            )
        else:
            transition(
                deployment,
                DeploymentState.STOPPED,
                message,
                log_tail=log_tail,
                pid=None,
                ready_at=None,
                next_restart_at=None,
            )
    elif kind == "failed":
        if state != DeploymentState.VERIFYING:
            return "duplicate"
        transition(deployment, DeploymentState.FAILED, message, pid=None)
    elif kind == "relaunched":
        # The agent started the engine of this launch again on its own while it could not reach the
        # control plane (its exit came first in the same queue, so the deployment is crashed or, past
        # the restart limit here, failed): the engine runs, and the record follows it.
        if state not in (DeploymentState.CRASHED, DeploymentState.FAILED):
            return "duplicate"
        pid = int(change["pid"])
        transition(
            deployment,
            DeploymentState.STARTING,
            f"Restarted on {host.name} by its agent while the control plane was unreachable (pid {pid}, "
            f"restart {int(change.get('attempt', 1))} of that outage); waiting for /health and /v1/models.",
            pid=pid,
            log_path=str(change.get("log_path", ""))[:500],
            started_at=datetime.fromtimestamp(float(change.get("at", time.time())), tz=UTC),
            ready_at=None,
            next_restart_at=None,
        )
    else:
        return "unknown"
    return "applied"


def _member_lost(host: Host, change: dict[str, Any]) -> str:
    """A host's Ray node (ray_lost) or headless vLLM node (member_lost, mp backend) of a deployment
    spanning hosts exited: vLLM cannot run with a pipeline stage missing, so the whole deployment goes
    through crash and restart (the head's engine exits too, as vLLM's does when its workers die;
    whichever report comes first counts, the other is a duplicate)."""
    deployment = (
        Deployment.objects.select_related("host", "model_version", "quantization")
        .filter(pk=change["deployment_id"])
        .filter(Q(host=host) | Q(members__host=host))
        .distinct()
        .first()
    )
    if deployment is None:
        return "gone"
    if change.get("start_token", "") != deployment.start_token:
        return "stale"
    if deployment.state not in (*SUPERVISED_STATES, DeploymentState.VERIFYING):
        return "duplicate"
    message = str(change.get("message", ""))[:2000] or f"The node on {host.name} exited."
    # Its "joined" is stale from now on: the restart waits until the agent's new node joins.
    with contextlib.suppress(Exception):
        get_redis().delete(_ray_key(deployment.pk, host.name))
    runtime.record_crash(
        deployment,
        f"{message} The deployment spans hosts and cannot run with a pipeline stage missing.",
        remote_log_tail=str(change.get("log_tail", ""))[-20_000:],
    )
    return "applied"


def _member_fetch_failed(host: Host, change: dict[str, Any]) -> str:
    """A member host of a deployment spanning hosts could not fetch the model files its Ray node's
    workers would load (a refused file, an unreachable store, no room): the deployment fails with the
    reason, as the head's own refused fetch does ("failed"), and every Ray node of it goes (ray_wanted)."""
    deployment = (
        Deployment.objects.select_related("host")
        .filter(pk=change["deployment_id"], members__host=host)
        .distinct()
        .first()
    )
    if deployment is None:
        return "gone"
    if change.get("start_token", "") != deployment.start_token:
        return "stale"
    # Before the engine's launch only: the member fetches before its Ray node starts, and the launch
    # waits for every node to join.
    if deployment.state not in (DeploymentState.PENDING, DeploymentState.VERIFYING, DeploymentState.CRASHED):
        return "duplicate"
    message = str(change.get("message", ""))[:2000] or f"Model files not fetched on {host.name}."
    transition(deployment, DeploymentState.FAILED, message, pid=None, next_restart_at=None)
    return "applied"


class FetchReportRefused(ValueError):
    """A `fetched` change that cannot be true of the deployment it names; the message says why."""


def _fetched(host: Host, change: dict[str, Any]) -> str:
    """The agent fetched and verified a version's files into its model root (for the deployment's engine,
    or as a member host before its Ray node): a passing VerificationRun for that host, as the co-located
    agent's fetch records (models_registry.store.record_fetch), and none for a cache hit (nothing was
    read). Keyed by deployment, start token and host, so a replayed batch records it once.

    A report that cannot be true (a deployment this host has no part in, another version's digest, numbers
    that do not fit the manifest) is refused and logged; it is acknowledged all the same, since sending it
    again would not make it true, and the rest of the batch applies.
    """
    deployment = (
        Deployment.objects.select_related("model_version")
        .filter(pk=change["deployment_id"])
        .filter(Q(host=host) | Q(members__host=host))
        .distinct()
        .first()
    )
    if deployment is None:
        log.warning(
            "agent %s: refused the fetch report of deployment %s: no such deployment on this host",
            host.name,
            change["deployment_id"],
        )
        return "refused"
    try:
        report = _fetch_report(deployment, change.get("fetch"))
    except FetchReportRefused as exc:
        log.warning("agent %s: refused the fetch report of deployment %s: %s", host.name, deployment.pk, exc)
        return "refused"
    if report["cached"]:
        return "cached"  # nothing was read from the store: no verification to record
    run = model_store.record_fetch(
        deployment.model_version,
        host.name,
        files=report["files"],
        bytes_hashed=report["bytes_verified"],
        started=report["started"],
        finished=report["finished"],
        key=f"{deployment.pk}:{change.get('start_token', '')}:{host.name}",
    )
    return "applied" if run is not None else "duplicate"


def _fetch_report(deployment: Deployment, raw: Any) -> dict[str, Any]:
    """The checked numbers of a `fetched` change (FetchReportRefused naming the first that is wrong)."""
    if not isinstance(raw, dict):
        raise FetchReportRefused("the change carries no fetch report")
    version = deployment.model_version
    manifest = model_store.manifest_of(version)
    if str(raw.get("digest", "")) != version.manifest_digest:
        raise FetchReportRefused(
            f"digest {str(raw.get('digest', ''))[:64]!r} is not the manifest digest of {version}"
        )
    counts: dict[str, int] = {}
    for name in ("files", "bytes_verified", "bytes_fetched", "resumed_files"):
        value = raw.get(name)
        # bool is an int to Python; true is no byte count.
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise FetchReportRefused(f"{name} is {value!r}, not a whole number of at least 0")
        counts[name] = value
    if counts["files"] != len(manifest):
        raise FetchReportRefused(f"{counts['files']} files, the manifest lists {len(manifest)}")
    if counts["resumed_files"] > counts["files"]:
        raise FetchReportRefused(f"{counts['resumed_files']} files resumed of {counts['files']}")
    cached = raw.get("cached")
    if not isinstance(cached, bool):
        raise FetchReportRefused(f"cached is {cached!r}, not true or false")
    total = sum(size for _, size, _ in manifest)
    if not cached and counts["bytes_verified"] < total:
        # Every byte is hashed as it arrives (or rehashed from a resumed part): fewer is no full fetch.
        raise FetchReportRefused(f"{counts['bytes_verified']} bytes verified, the manifest holds {total}")
    times = []
    for name in ("started_at", "finished_at"):
        value = raw.get(name)
        if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value < 1e11:
            raise FetchReportRefused(f"{name} is {value!r}, not a time")
        times.append(datetime.fromtimestamp(float(value), tz=UTC))
    if times[1] < times[0]:
        raise FetchReportRefused("it finished before it started")
    return {**counts, "cached": cached, "started": times[0], "finished": times[1]}


# --- Ray nodes of deployments that span hosts ----------------------------------------------------


def _ray_key(deployment_id: int, host_name: str) -> str:
    return key("agent", "ray", str(deployment_id), host_name)


def record_ray_nodes(host: Host, reports: list[dict[str, Any]]) -> None:
    """The host's Ray nodes that have joined their cluster, kept while its agent keeps saying so: a node
    its agent is (re)starting drops out at once, and a dead agent's word expires with the live TTL, so
    a lost host holds up the deployment's next launch."""
    if not reports:
        return
    ttl = max(1, round(settings.NODE_LIVE_TTL_SECONDS))
    try:
        pipe = get_redis().pipeline(transaction=False)
        for report in reports:
            name = _ray_key(int(report["deployment_id"]), host.name)
            if report.get("joined"):
                pipe.set(name, "1", ex=ttl)
            else:
                pipe.delete(name)
        pipe.execute()
    except Exception as exc:
        log.warning("could not record the Ray nodes of host %s: %s", host.name, exc)


def ray_nodes_missing(deployment: Deployment) -> list[str]:
    """The hosts of a deployment spanning hosts whose Ray node has not (or no longer) joined; [] when
    all have, or when the deployment runs on one host."""
    members = list(deployment.members.select_related("host").order_by("stage"))
    if not members:
        return []
    # With the mp backend the head runs no node before its engine: only the members stand by.
    names = [
        *([] if deployment.spans_hosts_with_mp else [deployment.host.name]),
        *(m.host.name for m in members),
    ]
    try:
        flags = get_redis().mget([_ray_key(deployment.pk, name) for name in names])
    except Exception:
        return names
    return [name for name, flag in zip(names, flags, strict=True) if not flag]


def ray_wanted(deployment: Deployment) -> bool:
    """Ray nodes stay up while the engine may run or is about to (a crash's backoff included), and go
    once it is stopped or given up on: stopping them earlier would kill the engine mid-drain."""
    return deployment.state not in RAY_DOWN_STATES


def ray_plans(host: Host, own: dict[int, Deployment]) -> list[dict[str, Any]]:
    """The Ray nodes this host runs: the head of its own deployments that span hosts, a worker of those
    it is a member of. A worker is wanted once the head's node has joined (it has a cluster to join)."""
    plans = []
    spanning = set(
        DeploymentMember.objects.filter(deployment__host=host).values_list("deployment_id", flat=True)
    )
    for deployment in (d for pk, d in own.items() if pk in spanning and not d.spans_hosts_with_mp):
        plans.append(
            describe_ray(deployment, deployment.host, 0, deployment.gpu_indices, ray_wanted(deployment), None)
        )
    memberships = DeploymentMember.objects.filter(host=host).select_related(
        "deployment__host", "deployment__model_version", "deployment__quantization", "host"
    )
    for member in memberships:
        deployment = member.deployment
        # A Ray worker needs the head's cluster to join; an mp member stands by from the start.
        head_joined = deployment.spans_hosts_with_mp or _ray_joined(deployment.pk, deployment.host.name)
        wanted = ray_wanted(deployment) and head_joined
        # The member's agent fetches the files before its Ray node starts (the head fetches at launch);
        # built only while its node is not in the cluster (the manifest is not read at every sync).
        fetch = fetch_spec(deployment, host) if wanted and not _ray_joined(deployment.pk, host.name) else None
        plan = describe_ray(deployment, host, member.stage, member.gpu_indices, wanted, fetch)
        if deployment.spans_hosts_with_mp:
            plan["launch"] = headless_launch(deployment, member) if wanted else None
        plans.append(plan)
    return plans


def headless_launch(deployment: Deployment, member: DeploymentMember) -> dict[str, Any] | None:
    """The member's `vllm serve --headless` for the head's current launch, while its engine runs."""
    if deployment.state not in HEADLESS_STATES or not deployment.start_token:
        return None
    plan = runtime.launch_plan(
        deployment,
        python=AGENT_PYTHON,
        model_path=remote_model_path(deployment),
        member=StageHost(member.host, tuple(member.gpu_indices or ()), member.stage),
    )
    return {"argv": plan.argv, "env": plan.env, "log_keep": settings.ENGINE_LOG_KEEP}


def _ray_joined(deployment_id: int, host_name: str) -> bool:
    try:
        return bool(get_redis().exists(_ray_key(deployment_id, host_name)))
    except Exception:
        return False


def describe_ray(
    deployment: Deployment,
    host: Host,
    stage: int,
    gpu_indices: list[int],
    wanted: bool,
    fetch: dict[str, object] | None,
) -> dict[str, Any]:
    """One host's part in a deployment's Ray cluster (nodes/agent/ray_node.start_argv builds `ray start`).

    `fetch`: a member host's fetch spec (model_fetch.fetch_spec) while the model store is active: vLLM's
    Ray workers load the model from the path the head's command line names, so the member's agent
    fetches and verifies the same version into its model root before `ray start`."""
    return {
        "deployment_id": deployment.pk,
        "backend": deployment.multi_host_backend,
        "role": "head" if stage == 0 else "worker",
        "stage": stage,
        "wanted": wanted,
        "start_token": deployment.start_token,
        "head_address": deployment.ray_head_address,
        "port": deployment.ray_port or DEFAULT_RAY_PORT,
        "node_ip": host.address,
        "num_gpus": len(gpu_indices or []),
        "gpu_indices": list(gpu_indices or []),
        "nodes": deployment.pipeline_parallel_size,
        "object_store_memory": settings.RAY_OBJECT_STORE_BYTES,
        "fetch": fetch,
    }


def wake_sleepers(host: Host, deployments: dict[int, Deployment]) -> None:
    """Sleeping engines someone asked to wake (the proxy holding a request): the control plane's worker
    wakes them (runtime.wake, a call to the engine's port), as the co-located supervisor's wake watch
    does. Checked at every sync, so a held request waits at most one telemetry period more."""
    sleeping = [pk for pk, d in deployments.items() if d.state == DeploymentState.SLEEPING]
    if not sleeping:
        return
    for deployment_id in wake_requested(sleeping):
        # runtime.wake clears the key; until the task has run, a later sync may send another (a no-op).
        # Sent by name, as nodes.services does: nodes.tasks imports the modules that import this one.
        app.signature(WAKE_TASK).apply_async(
            (deployment_id,), {"reason": "woken on request"}, queue="control"
        )


def host_info(host: Host) -> dict[str, Any]:
    return Host.objects.filter(pk=host.pk).values_list("agent_info", flat=True).first() or {}


def reconcile(deployment: Deployment) -> None:
    """Launches due (new, or a crashed engine's backoff over) and stops that need no engine."""
    if deployment.desired_state == DesiredState.RUNNING and (
        deployment.state == DeploymentState.PENDING
        or (
            deployment.state == DeploymentState.CRASHED
            and deployment.next_restart_at is not None
            and deployment.next_restart_at <= timezone.now()
        )
    ):
        missing = ray_nodes_missing(deployment)
        if missing:
            # vLLM's documented order: the Ray cluster first (head, then every worker), then the engine on
            # the head. A member host that is down holds the (re)launch here instead of burning restarts.
            _note_waiting(deployment, missing)
            return
        try:
            runtime.prepare_launch(deployment, python=AGENT_PYTHON, local=False)
        except Exception as exc:  # a database or disk error counts as a crash, retried with backoff
            log.exception("preparing the launch of deployment %s failed", deployment.pk)
            deployment.refresh_from_db()
            runtime.record_crash(
                deployment, f"Launch failed: {type(exc).__name__}: {exc}.", remote_log_tail=""
            )
    elif deployment.desired_state == DesiredState.STOPPED and deployment.state == DeploymentState.CRASHED:
        transition(deployment, DeploymentState.STOPPED, "Stopped while waiting to restart.", pid=None)
    elif (
        deployment.state == DeploymentState.READY
        and deployment.restart_count
        and deployment.ready_at
        and (timezone.now() - deployment.ready_at).total_seconds() >= settings.NODE_STABLE_SECONDS
    ):
        Deployment.objects.filter(pk=deployment.pk).update(restart_count=0)


def _note_waiting(deployment: Deployment, missing: list[str]) -> None:
    """Say once, in the deployment's history, which hosts its launch waits for."""
    hosts = ", ".join(missing)
    if deployment.spans_hosts_with_mp:
        message = (
            f"Waiting for {hosts} to stand by (agent up, model files there) before launching the engine."
        )
    else:
        message = f"Waiting for the Ray node(s) of {hosts} to join before launching the engine."
    last = deployment.events.order_by("-at", "-id").values_list("message", flat=True).first()
    if last != message:
        record_event(deployment, message)


def _heartbeat_due(host: Host, info: dict[str, Any]) -> bool:
    """Whether this sync writes the host row: at most once per NODE_HEARTBEAT_SECONDS while nothing changed.

    The agent syncs every NODE_TELEMETRY_SECONDS; the row needs a fresh timestamp only often enough for
    the unreachable sweep, and the agent's info only when it changes.
    """
    if host.last_heartbeat is None or host.state in (HostState.UNKNOWN, HostState.UNREACHABLE):
        return True
    if (host.agent_info or {}) != info:
        return True
    return (timezone.now() - host.last_heartbeat).total_seconds() >= settings.NODE_HEARTBEAT_SECONDS


def describe(deployment: Deployment, *, drain: bool = False) -> dict[str, Any]:
    """One deployment as its agent needs it; `launch` carries the command line when one is due."""
    wanted = deployment.desired_state == DesiredState.RUNNING
    launch = None
    if (
        wanted
        and deployment.state == DeploymentState.VERIFYING
        and deployment.start_token
        and not deployment.pid
    ):
        plan = runtime.launch_plan(deployment, python=AGENT_PYTHON, model_path=remote_model_path(deployment))
        launch = {
            "argv": plan.argv,
            "env": plan.env,
            "log_keep": settings.ENGINE_LOG_KEEP,
            # Files the agent fetches from the model store and verifies before it starts the engine.
            "fetch": fetch_spec(deployment),
        }
    return {
        "id": deployment.pk,
        "name": deployment.name,
        "engine": deployment.engine,
        "served_model_name": deployment.served_model_name,
        "port": deployment.port,
        "block_size": deployment.block_size,
        "desired_state": deployment.desired_state,
        "state": deployment.state,
        "start_token": deployment.start_token,
        "pid": deployment.pid,
        "engine_key": engine_api_key(deployment) if deployment.start_token else "",
        "bind_host": bind_host_for(deployment.host),
        "drain": drain,
        "launch": launch,
    }


# --- telemetry --------------------------------------------------------------------------------------


def publish_telemetry(
    host: Host,
    deployments: dict[int, Deployment],
    engines: list[dict[str, Any]],
    gpus: list[dict[str, Any]],
    info: dict[str, Any],
) -> set[int]:
    """The agent's engine live records and GPU samples, as the co-located supervisor publishes them;
    returns the host's GPU indices (the ones whose samples are kept)."""
    indices = set(Gpu.objects.filter(host=host).values_list("index", flat=True))
    known = {pk: (d.name, str(d.state)) for pk, d in deployments.items()}
    out = agent_telemetry.telemetry(host.name, known, indices, engines, gpus, info)
    sends = out.sends()
    groups = agent_telemetry.member_keys(sends)
    try:
        keys, args = out.script_call(groups or [])
        listening = get_redis().register_script(agent_telemetry.WRITE_SCRIPT)(keys=keys, args=args)
    except Exception as exc:  # Redis down: the proxy treats missing live data as busy
        log.warning("could not write live state of host %s: %s", host.name, exc)
        listening = 1
    if groups is None or listening:
        push_events(sends)  # one hop into the event loop for all of them (core.live.push_live_events)
    return indices


# --- drain flag -------------------------------------------------------------------------------------


def request_drain(deployment_id: int) -> None:
    """Tell the agent that the stop it is about to see waits for in-flight requests first."""
    try:
        get_redis().set(key("agent", "drain", str(deployment_id)), "1", ex=3600)
    except Exception as exc:
        log.warning("could not flag the drain of deployment %s: %s", deployment_id, exc)
    agent_generation_signals.bump_hosts_of_deployments([deployment_id])


def _drains_requested(deployment_ids: list[int]) -> set[int]:
    """The deployments whose pending stop is a drain (one MGET for the whole host)."""
    if not deployment_ids:
        return set()
    try:
        flags = get_redis().mget([key("agent", "drain", str(pk)) for pk in deployment_ids])
    except Exception:
        return set()
    return {pk for pk, flag in zip(deployment_ids, flags, strict=True) if flag}


# --- logs through the agent -------------------------------------------------------------------------


def _requests_key(host_name: str) -> str:
    return key("agent", "logreq", host_name)


def _answer_key(request_id: str) -> str:
    return key("agent", "logans", request_id)


def _meta_key(request_id: str) -> str:
    return key("agent", "logmeta", request_id)


def request_log(
    deployment: Deployment, *, lines: int, max_bytes: int, timeout: float | None = None
) -> dict[str, Any] | None:
    """Ask the deployment's agent for the tail of its engine log; None when it did not answer in time.

    The request waits in Redis for the agent's next sync (at most NODE_TELEMETRY_SECONDS away); the
    agent posts the lines to /api/agent/logs/, which pushes them to the list this call waits on.
    """
    wait = timeout if timeout is not None else settings.AGENT_LOG_TIMEOUT_SECONDS
    request_id = uuid.uuid4().hex
    request = {
        "id": request_id,
        "deployment_id": deployment.pk,
        "lines": max(1, min(lines, LOG_DOWNLOAD_MAX_LINES)),
        "max_bytes": max(1, min(max_bytes, LOG_DOWNLOAD_MAX_BYTES)),
    }
    expiry = max(5, int(wait) + 5)
    redis = get_redis()
    pipe = redis.pipeline(transaction=False)
    pipe.set(
        _meta_key(request_id),
        json.dumps({"host": deployment.host.name, "deployment_id": deployment.pk}),
        ex=expiry,
    )
    pipe.rpush(_requests_key(deployment.host.name), json.dumps(request))
    pipe.expire(_requests_key(deployment.host.name), expiry)
    pipe.execute()
    agent_generation.bump(
        [deployment.host.name], at_once=True
    )  # the next sync is a full one, which hands it out
    answer = redis.blpop([_answer_key(request_id)], timeout=max(1, round(wait)))
    if answer is None:
        return None
    value = json.loads(answer[1])
    return value if isinstance(value, dict) else None


def take_log_requests(host_name: str) -> list[dict[str, Any]]:
    """The log requests waiting for this host's agent (each handed out once)."""
    try:
        pipe = get_redis().pipeline(transaction=True)
        pipe.lrange(_requests_key(host_name), 0, 99)
        pipe.ltrim(_requests_key(host_name), 100, -1)
        raw, _ = pipe.execute()
    except Exception as exc:
        log.warning("could not read log requests of host %s: %s", host_name, exc)
        return []
    return [json.loads(item) for item in raw]


def answer_log(host: Host, answer: dict[str, Any]) -> bool:
    """An agent's answer to a log request; refused (False) when the request was not for this host."""
    redis = get_redis()
    raw = redis.get(_meta_key(str(answer["request_id"])))
    if raw is None:
        return False
    meta = json.loads(raw)
    if meta.get("host") != host.name or meta.get("deployment_id") != answer["deployment_id"]:
        return False
    body = {
        "text": str(answer.get("text", ""))[-LOG_DOWNLOAD_MAX_BYTES:],
        "path": str(answer.get("path", "")),
        "truncated": bool(answer.get("truncated", False)),
    }
    pipe = redis.pipeline(transaction=False)
    pipe.rpush(_answer_key(str(answer["request_id"])), json.dumps(body))
    pipe.expire(_answer_key(str(answer["request_id"])), 30)
    pipe.delete(_meta_key(str(answer["request_id"])))
    pipe.execute()
    return True
