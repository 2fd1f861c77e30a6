"""What the agent does to one deployment: launch, stop, restart, re-adopt after an agent restart.

Each function takes a deployment id, re-reads the row, and is idempotent: a launch of an engine
that already runs with the current start token does nothing, a stop of a stopped one does nothing.
Celery tasks and the supervisor call these; a per-deployment lock keeps them from racing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from models_registry import services as registry
from models_registry.store import active_store
from nodes import process
from nodes.agent.model_fetch import agent_model_root, fetch_for_launch, remote_model_path
from nodes.agent.modelstore import FetchError
from nodes.agent.services import bind_host_for, engine_spec, launch_record, new_start_token, redact_argv
from nodes.choices import DeploymentState, DesiredState, Engine
from nodes.engines import EngineSpec, get_adapter
from nodes.engines import vllm as vllm_adapter
from nodes.lifecycle import clear_wake_request, engine_api_key, record_event, transition
from nodes.models import Deployment
from nodes.preflight import preflight_deployment
from nodes.probes import http_get
from nodes.spec import StageHost

log = logging.getLogger(__name__)

_locks: dict[int, threading.Lock] = {}
_locks_guard = threading.Lock()


def deployment_lock(deployment_id: int) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(deployment_id, threading.Lock())


@contextlib.contextmanager
def locked(deployment_id: int, *, wait: bool = True) -> Iterator[bool]:
    """Hold the deployment's lock; with wait=False, yield False at once if someone else holds it."""
    lock = deployment_lock(deployment_id)
    acquired = lock.acquire(blocking=wait)
    try:
        yield acquired
    finally:
        if acquired:
            lock.release()


def engine_dir(host_name: str) -> Path:
    return Path(settings.ENGINE_LOG_DIR) / host_name


def _load(deployment_id: int) -> Deployment | None:
    return (
        Deployment.objects.select_related("host", "model_version", "quantization")
        .filter(pk=deployment_id)
        .first()
    )


def engine_running(deployment: Deployment) -> bool:
    """Whether the engine process recorded on the row runs and was started with its start token."""
    return bool(
        deployment.pid
        and deployment.start_token
        and process.is_alive(deployment.pid)
        and process.carries_token(deployment.pid, deployment.start_token)
    )


def verify_files(deployment: Deployment) -> str | None:
    """Check the version's files on this host against its manifest; an error message, or None if fine."""
    version = deployment.model_version
    host_name = deployment.host.name
    # Always re-verify: unchanged files cost one stat each (the hash cache), and files swapped since
    # the last passing run are caught here rather than served.
    run = registry.verify_version_on_host(version.pk, host_name)
    if getattr(run, "ok", False):
        return None
    problems = getattr(run, "problems", None) or []
    detail = (
        "; ".join(f"{p.get('path')}: {p.get('kind')}" for p in problems[:5] if isinstance(p, dict))
        or "see the version's verification history"
    )
    return f"Files of {version} do not match its manifest on {host_name}: {detail}."


def launch(deployment_id: int) -> str:
    """Verify files, fit-check, start the engine; the supervisor then waits for /health and /v1/models.

    An unexpected error (database, disk) counts as a crash, so the launch is retried with backoff
    instead of leaving the deployment stuck in VERIFYING.
    """
    with locked(deployment_id):
        deployment = _load(deployment_id)
        if deployment is None:
            return "gone"
        try:
            return _launch(deployment)
        except Exception as exc:
            log.exception("launch of deployment %s failed", deployment_id)
            deployment.refresh_from_db()
            if engine_running(deployment):
                return "started"
            record_crash(deployment, f"Launch failed: {type(exc).__name__}: {exc}.")
            return "error"


@dataclass
class LaunchPlan:
    """What to start for a deployment whose checks passed: its engine input, command line and env."""

    spec: EngineSpec
    argv: list[str]
    env: dict[str, str]


def prepare_launch(
    deployment: Deployment, *, python: str | None = None, local: bool = True
) -> LaunchPlan | str:
    """The checks before a launch (files, fit, port), a new start token and the engine's command line.

    Returns the plan, or the outcome when the deployment must not (or need not) start. `local=False`
    is the agent channel's use: the engine starts on another machine, whose agent checks its port and
    runs the command line with its own interpreter (`python`).
    """
    if deployment.desired_state != DesiredState.RUNNING:
        return "not wanted"
    if local and engine_running(deployment):
        return "already running"
    if (
        local
        and deployment.pid
        and process.is_alive(deployment.pid)
        and deployment.state == DeploymentState.STARTING
    ):
        return "already starting"

    # An engine started on this machine is fetched here; a fleet agent's host (the agent channel,
    # local=False) fetches into the model root its agent reported, after this sync hands it the plan
    # (agent_channel.describe). An agent that reports no model root is checked in place, as before.
    store = active_store()
    if store is not None and not local and agent_model_root(deployment) is None:
        store = None
    model_path = None
    if store is None:
        transition(deployment, DeploymentState.VERIFYING, "Verifying model files on the host.")
        problem = verify_files(deployment)
        if problem:
            transition(deployment, DeploymentState.FAILED, problem, pid=None)
            return "verification failed"
    elif not local:
        transition(
            deployment,
            DeploymentState.VERIFYING,
            f"Fetching model files from the store '{store.name}' on {deployment.host.name}.",
        )
        model_path = remote_model_path(deployment)
    else:
        transition(
            deployment, DeploymentState.VERIFYING, f"Fetching model files from the store '{store.name}'."
        )
        try:
            model_path = fetch_for_launch(deployment, store)
        except FetchError as exc:
            transition(
                deployment,
                DeploymentState.FAILED,
                f"Model files not fetched from '{store.name}': {exc}",
                pid=None,
            )
            return "fetch failed"
    deployment.model_version.refresh_from_db()

    check = preflight_deployment(deployment, check_reachable=False)
    if not check.ok:
        transition(deployment, DeploymentState.FAILED, f"Refused before start: {check.summary()}", pid=None)
        return "refused"
    if local:
        reap_orphan(deployment)
        bind = bind_host_for(deployment.host)
        if not process.port_is_free(deployment.port, bind):
            transition(deployment, DeploymentState.FAILED, port_in_use_message(deployment), pid=None)
            return "port in use"

    # A new token per launch: a new engine key, and a pid that cannot be mistaken for the old one.
    deployment.start_token = new_start_token()
    Deployment.objects.filter(pk=deployment.pk).update(start_token=deployment.start_token)
    return launch_plan(deployment, python=python, model_path=model_path)


def launch_plan(
    deployment: Deployment,
    *,
    python: str | None = None,
    model_path: str | None = None,
    member: StageHost | None = None,
) -> LaunchPlan:
    """The command line of the deployment's current start token (deterministic, so it can be rebuilt);
    `member`: a member host's headless node of it (mp backend)."""
    adapter = get_adapter(deployment.engine)
    spec = engine_spec(deployment, python=python, model_path=model_path, member=member)
    return LaunchPlan(spec=spec, argv=adapter.build_argv(spec), env=adapter.build_env(spec))


def port_in_use_message(deployment: Deployment) -> str:
    return (
        f"Refused before start: port {deployment.port} on {deployment.host.name} is already in use "
        "by another process; pick a free port."
    )


def _launch(deployment: Deployment) -> str:
    plan = prepare_launch(deployment)
    if isinstance(plan, str):
        return plan
    spec, argv, env = plan.spec, plan.argv, plan.env
    record = process.start_engine(
        argv=argv,
        env=env,
        directory=engine_dir(deployment.host.name),
        deployment_id=deployment.pk,
        port=deployment.port,
        start_token=deployment.start_token,
        log_keep=settings.ENGINE_LOG_KEEP,
    )
    transition(
        deployment,
        DeploymentState.STARTING,
        f"Engine started (pid {record.pid}); waiting for /health and /v1/models.",
        pid=record.pid,
        start_token=deployment.start_token,
        launch=launch_record(deployment, spec, argv, env),
        launch_argv=redact_argv(argv, spec.api_key),
        reported_quantization="",
        log_path=record.log_path,
        started_at=timezone.now(),
        ready_at=None,
        next_restart_at=None,
    )
    log.info("launched deployment %s pid %s", deployment.pk, record.pid)
    return "started"


def reported_kernel(deployment: Deployment) -> str | None:
    """The quantization kernel the engine's log names since its start (vLLM logs it while loading).

    Only vLLM logs it; the simulator does not (yet), so a simulated engine reports none.
    """
    if deployment.engine != Engine.VLLM or not deployment.log_path:
        return None
    text = process.tail(deployment.log_path, 20_000, 4 * 1024 * 1024)
    return vllm_adapter.reported_quantization_kernel(text)


def reap_orphan(deployment: Deployment) -> bool:
    """Stop an engine this agent started for `deployment` that the database lost track of.

    That happens when the agent fails between starting the process and recording its pid; the
    state file and the start token in the process's environment prove the process is ours.
    """
    record = process.read_record(engine_dir(deployment.host.name), deployment.pk)
    if record is None or record.pid == deployment.pid:
        return False
    if not (process.is_alive(record.pid) and process.carries_token(record.pid, record.start_token)):
        return False
    log.warning("stopping orphaned engine pid %s of deployment %s", record.pid, deployment.pk)
    process.stop_engine(record.pid, settings.NODE_STOP_TIMEOUT_SECONDS)
    process.forget_record(engine_dir(deployment.host.name), deployment.pk)
    return True


def _in_flight(deployment: Deployment) -> float | None:
    """Running + waiting requests from the engine's /metrics, or None when it has none to read."""
    adapter = get_adapter(deployment.engine)
    if adapter.metrics_path is None:
        return None
    result = http_get(
        deployment.host.address,
        deployment.port,
        adapter.metrics_path,
        timeout=1.0,
        api_key=engine_api_key(deployment),
    )
    if not result.ok:
        return None
    metrics = adapter.parse_metrics(result.body.decode("utf-8", errors="replace"))
    return metrics.num_requests_running + metrics.num_requests_waiting


def stop(deployment_id: int, *, drain: bool = False, drain_timeout: float = 300.0) -> str:
    """Stop the engine: optionally wait for in-flight requests, then SIGTERM, then SIGKILL after a timeout."""
    with locked(deployment_id):
        deployment = _load(deployment_id)
        if deployment is None:
            return "gone"
        if deployment.desired_state != DesiredState.STOPPED:
            return "not wanted"
        if deployment.state == DeploymentState.STOPPED and not deployment.pid:
            return "already stopped"
        pid = deployment.pid
        if pid and process.is_alive(pid):
            if deployment.state != DeploymentState.STOPPING:
                transition(deployment, DeploymentState.STOPPING, "Stopping the engine.")
            if drain:
                deadline = time.monotonic() + drain_timeout
                time.sleep(settings.NODE_DRAIN_SETTLE_SECONDS)
                while time.monotonic() < deadline:
                    pending = _in_flight(deployment)
                    if not pending:
                        break
                    time.sleep(0.5)
            forced = process.stop_engine(pid, settings.NODE_STOP_TIMEOUT_SECONDS)
            message = (
                "Engine did not exit on SIGTERM within the stop timeout; killed."
                if forced
                else "Engine stopped gracefully."
            )
        else:
            message = "Engine was not running."
        process.forget_record(engine_dir(deployment.host.name), deployment.pk)
        transition(
            deployment,
            DeploymentState.STOPPED,
            message,
            log_tail=process.tail(deployment.log_path, 20) if deployment.log_path else "",
            pid=None,
            ready_at=None,
            next_restart_at=None,
        )
        return "stopped"


SLEEP_TIMEOUT_SECONDS = 60.0
WAKE_TIMEOUT_SECONDS = 300.0


def _is_sleeping(deployment: Deployment) -> bool | None:
    """What the engine's GET /is_sleeping says (None: no readable answer)."""
    result = http_get(
        deployment.host.address,
        deployment.port,
        "/is_sleeping",
        timeout=2.0,
        api_key=engine_api_key(deployment),
    )
    if not result.ok:
        return None
    try:
        value = json.loads(result.body).get("is_sleeping")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, bool) else None


def sleep(deployment_id: int, level: int, *, reason: str = "") -> str:
    """Put a ready engine to sleep: the proxy is told first (state sleeping, so no new request goes to
    it), then POST /sleep?level=N, confirmed with /is_sleeping. A request that reached it in between
    is not cut: the engine is only put to sleep when it has none running or waiting."""
    with locked(deployment_id):
        deployment = _load(deployment_id)
        if deployment is None:
            return "gone"
        if deployment.state != DeploymentState.READY:
            return f"not ready ({deployment.state})"
        if "--enable-sleep-mode" not in (deployment.launch_argv or []):
            record_event(
                deployment,
                "Sleep refused: the engine was started without sleep mode; restart it to enable it.",
            )
            return "no sleep mode"
        why = f" ({reason})" if reason else ""
        transition(deployment, DeploymentState.SLEEPING, f"Going to sleep at level {level}{why}.")
        pending = _in_flight(deployment)
        if pending:
            transition(deployment, DeploymentState.READY, f"Stayed awake: {pending:.0f} requests in flight.")
            return "busy"
        key = engine_api_key(deployment)
        result = http_get(
            deployment.host.address,
            deployment.port,
            f"/sleep?level={int(level)}&mode=abort",
            timeout=SLEEP_TIMEOUT_SECONDS,
            api_key=key,
            method="POST",
        )
        if not result.ok or _is_sleeping(deployment) is not True:
            transition(
                deployment,
                DeploymentState.READY,
                f"Sleep failed: /sleep answered {result.status or result.error}; the engine stays awake.",
            )
            return "failed"
        transition(
            deployment, DeploymentState.SLEEPING, f"Asleep at level {level}{why}.", sleeping_level=int(level)
        )
        return "asleep"


def wake(deployment_id: int, reason: str = "") -> str:
    """Wake a sleeping engine: POST /wake_up (it answers once the memory is back), confirmed with
    /is_sleeping, then ready again (the proxy routes to it at the config change)."""
    with locked(deployment_id):
        deployment = _load(deployment_id)
        if deployment is None:
            return "gone"
        clear_wake_request(deployment_id)
        if deployment.state != DeploymentState.SLEEPING:
            return f"not sleeping ({deployment.state})"
        began = time.monotonic()
        result = http_get(
            deployment.host.address,
            deployment.port,
            "/wake_up",
            timeout=WAKE_TIMEOUT_SECONDS,
            api_key=engine_api_key(deployment),
            method="POST",
        )
        if not result.ok or _is_sleeping(deployment) is not False:
            record_event(deployment, f"Wake-up failed: /wake_up answered {result.status or result.error}.")
            return "failed"
        why = f" ({reason})" if reason else ""
        transition(
            deployment,
            DeploymentState.READY,
            f"Awake after {time.monotonic() - began:.2f} s{why}.",
            sleeping_level=0,
        )
        return "awake"


def restart(deployment_id: int) -> str:
    """Stop the running engine (if any) and launch it again with a new start token."""
    with locked(deployment_id):
        deployment = _load(deployment_id)
        if deployment is None:
            return "gone"
        if deployment.pid and process.is_alive(deployment.pid):
            transition(deployment, DeploymentState.STOPPING, "Restarting the engine.")
            process.stop_engine(deployment.pid, settings.NODE_STOP_TIMEOUT_SECONDS)
        transition(deployment, DeploymentState.PENDING, "Restart: launching again.", pid=None)
    return launch(deployment_id)


def record_crash(deployment: Deployment, reason: str, *, remote_log_tail: str | None = None) -> None:
    """The engine exited or hung: schedule a restart with capped exponential backoff, or give up.

    After NODE_MAX_RESTARTS restarts that did not stay up, the deployment is FAILED with the last
    log lines attached, for a person to read.
    """
    if remote_log_tail is not None:
        # Reported by the host's agent over the agent channel: the log and state file are on its disk.
        log_tail = remote_log_tail
    else:
        log_tail = process.tail(deployment.log_path, 40) if deployment.log_path else ""
        process.forget_record(engine_dir(deployment.host.name), deployment.pk)
    if deployment.desired_state == DesiredState.STOPPED:
        transition(deployment, DeploymentState.STOPPED, reason, log_tail=log_tail, pid=None, ready_at=None)
        return
    attempts = deployment.restart_count + 1
    limit = settings.NODE_MAX_RESTARTS
    if attempts > limit:
        transition(
            deployment,
            DeploymentState.FAILED,
            f"{reason} Gave up after {limit} restarts; fix the cause and start it again.",
            log_tail=log_tail,
            pid=None,
            ready_at=None,
            next_restart_at=None,
        )
        return
    delay = min(
        settings.NODE_RESTART_BACKOFF_MAX_SECONDS,
        settings.NODE_RESTART_BACKOFF_SECONDS * 2 ** (attempts - 1),
    )
    transition(
        deployment,
        DeploymentState.CRASHED,
        f"{reason} Restart {attempts} of {limit} in {delay:.1f} s.",
        log_tail=log_tail,
        pid=None,
        ready_at=None,
        restart_count=attempts,
        restarts_total=deployment.restarts_total + 1,
        next_restart_at=timezone.now() + timedelta(seconds=delay),
    )


def kill_hung(deployment: Deployment, reason: str) -> None:
    if deployment.pid:
        process.stop_engine(deployment.pid, timeout=5.0)
    record_crash(deployment, reason)


def adopt(host_name: str) -> list[int]:
    """On agent start: keep engines that still run (pid alive + start token), drop the rest.

    An engine that survived the agent's restart keeps serving and is not launched twice; one that
    died while the agent was away is handled as a crash (restart with backoff).
    """
    adopted = []
    candidates = Deployment.objects.select_related("host", "model_version", "quantization").filter(
        host__name=host_name, pid__isnull=False
    )
    for deployment in candidates:
        with locked(deployment.pk):
            record = process.read_record(engine_dir(host_name), deployment.pk)
            same = (
                record is not None
                and record.pid == deployment.pid
                and record.start_token == deployment.start_token
                and record.port == deployment.port
            )
            if same and engine_running(deployment):
                # Its health is the supervisor's business from here on, like any engine's.
                adopted.append(deployment.pk)
                log.info("re-adopted deployment %s (pid %s)", deployment.pk, deployment.pid)
                continue
            if deployment.state in (DeploymentState.STOPPED, DeploymentState.FAILED):
                Deployment.objects.filter(pk=deployment.pk).update(pid=None)
                continue
            record_crash(deployment, "The engine was gone when the agent restarted.")
    for deployment in Deployment.objects.select_related("host").filter(
        host__name=host_name, pid__isnull=True
    ):
        with locked(deployment.pk):
            reap_orphan(deployment)
    return adopted
