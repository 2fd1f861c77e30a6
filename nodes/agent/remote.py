"""The node agent of a fleet host: `python -m nodes.agent --host NAME --control-plane URL`.

It holds no database credentials and imports nothing of Django: all it knows of the control plane
is the agent channel (/api/agent/, nodes/agent_channel.py) and the host's token. Once per
telemetry period it probes its engines, judges their health (the co-located supervisor's rules:
liveness, readiness, progress, in nodes/agent/health.py), samples the GPUs, and sends one batch:
heartbeat + telemetry + the state changes it queued. The answer lists the deployments the host must
run, with a command line for each launch that is due; the agent starts and stops engines to match.

Engines are children of the agent but run in their own sessions: when the control plane is
unreachable they keep serving, the agent keeps supervising them and queues what it sees (an
engine that became ready, one that exited) in a file next to the engine logs; when the control
plane answers again the queue is replayed, oldest first. Every change names the start token of its
engine, so replaying one twice changes nothing (nodes/agent_channel.py applies it only once).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import logging
import os
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodes import process
from nodes.agent import health, ray_node
from nodes.agent.client import (
    CONTROL_PLANE_ENV,
    AgentRefused,
    ControlPlane,
    ControlPlaneUnavailable,
    read_token,
)
from nodes.agent.gpus import GpuSource, simulated_gpu_config
from nodes.agent.health import EngineTrack, Observation
from nodes.agent.modelstore import FetchError, StoreConfig, WantedFile, fetch_version
from nodes.engines import vllm as vllm_adapter

log = logging.getLogger("nodes.agent")

# Stands for the agent's own interpreter in the command lines the control plane sends
# (nodes/agent_channel.AGENT_PYTHON; a test keeps the two equal).
AGENT_PYTHON = "{agent-python}"
# Changes kept while the control plane is away; beyond it the oldest are dropped (and logged).
OUTBOX_LIMIT = 10_000
LOG_ANSWER_MAX_LINES = 100_000
LOG_ANSWER_MAX_BYTES = 8 * 1024 * 1024
# Until the control plane's first answer says otherwise (nodes/agent_channel.agent_settings).
DEFAULT_SETTINGS: dict[str, float] = {
    "telemetry_seconds": 1.0,
    "heartbeat_seconds": 2.0,
    "hang_seconds": 30.0,
    "startup_timeout_seconds": 900.0,
    "stop_timeout_seconds": 20.0,
    "log_max_bytes": 20 * 1024 * 1024,
    "log_keep": 5,
    "max_restarts": 5,
    "restart_backoff_seconds": 2.0,
    "restart_backoff_max_seconds": 60.0,
}


@dataclass(kw_only=True)
class LocalEngine(EngineTrack):
    """An engine process this agent runs (or re-adopted after a restart), and its health track."""

    deployment_id: int
    pid: int
    start_token: str
    port: int
    log_path: str
    started_at: float
    # starting | ready | degraded | adopted (state not known until the control plane answers) | stopping
    phase: str = "starting"


def _installed_version(package: str) -> str | None:
    """The version of `package` in the agent's interpreter (the one engines run with), or None."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def own_argv(argv: list[Any]) -> list[str]:
    """A command line from the control plane with this agent's interpreter in place of AGENT_PYTHON."""
    return [sys.executable if part == AGENT_PYTHON else str(part) for part in argv]


def observe(engine: LocalEngine, deployment: dict[str, Any]) -> Observation:
    """Probe one engine on this host (loopback). Never raises."""
    if not process.is_alive(engine.pid):
        return Observation(alive=False)
    return health.probe(
        "127.0.0.1",
        engine.port,
        engine=deployment["engine"],
        served_model_name=deployment["served_model_name"],
        api_key=deployment.get("engine_key") or None,
    )


class Agent:
    """One host's agent. `tick()` does one round (probe, judge, sync, act); `run()` loops."""

    def __init__(
        self,
        host_name: str,
        control_plane: ControlPlane,
        gpus: GpuSource,
        engine_dir: Path,
        model_root: Path | None = None,
        ray_temp_dir: str | None = None,
    ) -> None:
        self.host_name = host_name
        # Ray nodes this host runs for deployments that span hosts (nodes/agent/ray_node.py), and the
        # control plane's latest word on each (role, head address, wanted).
        self.ray_nodes: dict[int, ray_node.RayNode] = {}
        self.ray_plans: dict[int, dict[str, Any]] = {}
        self.ray_temp_dir = ray_temp_dir
        # Where versions fetched from the model store live on this host (reported to the control plane,
        # which builds the engine's command line with it).
        self.model_root = (model_root or engine_dir / "model-cache").resolve()
        self.fetching: set[int] = set()  # deployments whose files are being fetched before their launch
        # A member host's fetch before its Ray node starts: the deployments being fetched, and the
        # (start token, digest) whose files arrived verified (consumed when the node starts).
        self.ray_fetching: set[int] = set()
        self.ray_files: dict[int, tuple[str, str]] = {}
        # Member hosts of mp deployments whose files are here: the head's launch may go.
        self.standing_by: set[int] = set()
        self.headless_launched: dict[int, str] = {}  # the launch (start token) each headless node ran for
        self.control_plane = control_plane
        self.gpus = gpus
        self.engine_dir = engine_dir
        self.settings = dict(DEFAULT_SETTINGS)
        self.engines: dict[int, LocalEngine] = {}
        self.deployments: dict[int, dict[str, Any]] = {}
        self.generation: int | None = None  # of the last full answer (nodes/agent_generation.py)
        self.inventory_sent = False
        self.connected = False
        self.ever_connected = False
        self.stop_event = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"agent-{host_name}")
        self._lock = threading.Lock()  # outbox and engines, shared with stop threads
        # The launch of each engine this agent started (memory only: its environment holds the engine
        # key), so one that exits while the control plane is away can be started again as it was; and
        # those relaunches: deployment -> (attempt, when due, monotonic), and the attempts of this outage.
        self.launched: dict[int, dict[str, Any]] = {}
        self.relaunch_due: dict[int, tuple[int, float]] = {}
        self.away_attempts: dict[int, int] = {}
        self.outbox_path = engine_dir / "agent-outbox.json"
        self.outbox: list[dict[str, Any]] = self._load_outbox()

    # --- the queue of state changes ---

    def _load_outbox(self) -> list[dict[str, Any]]:
        try:
            value = json.loads(self.outbox_path.read_text())
        except (OSError, ValueError):
            return []
        return [c for c in value if isinstance(c, dict)] if isinstance(value, list) else []

    def _save_outbox(self) -> None:
        self.engine_dir.mkdir(parents=True, exist_ok=True)
        temporary = self.outbox_path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.outbox))
        temporary.replace(self.outbox_path)

    def queue(self, kind: str, engine: LocalEngine, **fields: Any) -> None:
        """Queue one state change for the control plane (kept on disk until it is acknowledged)."""
        change = {
            "id": uuid.uuid4().hex,
            "kind": kind,
            "deployment_id": engine.deployment_id,
            "start_token": engine.start_token,
            "at": time.time(),
            **fields,
        }
        with self._lock:
            self.outbox.append(change)
            if len(self.outbox) > OUTBOX_LIMIT:
                dropped = self.outbox[: len(self.outbox) - OUTBOX_LIMIT]
                del self.outbox[: len(dropped)]
                log.error("dropped %d queued changes: the control plane has been away too long", len(dropped))
            self._save_outbox()
        if kind == "failed":  # a refusal: its reason belongs in the agent's own log, not only the console's
            log.warning("queued failed of deployment %s: %s", engine.deployment_id, fields.get("message", ""))
        else:
            log.info("queued %s of deployment %s", kind, engine.deployment_id)

    # --- start ---

    def adopt(self) -> None:
        """Find engines a previous run of this agent started that still run (their state files)."""
        self.ray_nodes = ray_node.adopt(self.engine_dir)
        headless = {d: n.launch_token for d, n in self.ray_nodes.items() if n.backend == "mp"}
        self.headless_launched.update(headless)
        self.standing_by.update(headless)
        for record_file in sorted(self.engine_dir.glob("deployment-*.json")):
            with contextlib.suppress(OSError, ValueError, TypeError):
                record = process.EngineRecord(**json.loads(record_file.read_text()))
                if process.is_alive(record.pid) and process.carries_token(record.pid, record.start_token):
                    self.engines[record.deployment_id] = LocalEngine(
                        deployment_id=record.deployment_id,
                        pid=record.pid,
                        start_token=record.start_token,
                        port=record.port,
                        log_path=record.log_path,
                        started_at=record.started_at,
                        phase="adopted",
                    )
                    log.info("re-adopted deployment %s (pid %s)", record.deployment_id, record.pid)
                else:
                    process.forget_record(self.engine_dir, record.deployment_id)

    def run(self) -> None:
        self.adopt()
        try:
            while not self.stop_event.is_set():
                began = time.monotonic()
                try:
                    self.tick()
                except Exception:  # one bad round must not end supervision of the host
                    log.exception("agent round failed on %s", self.host_name)
                interval = float(self.settings["telemetry_seconds"])
                self.stop_event.wait(max(0.05, interval - (time.monotonic() - began)))
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)

    # --- one round ---

    def tick(self) -> None:
        now = time.monotonic()
        watched = [
            (e, self.deployments[e.deployment_id])
            for e in list(self.engines.values())
            if e.phase != "stopping" and e.deployment_id in self.deployments
        ]
        observations = list(self.pool.map(lambda pair: observe(*pair), watched))
        engines_live = []
        sim_reports: dict[int, list[dict[str, Any]]] = {}
        for (engine, deployment), obs in zip(watched, observations, strict=True):
            self.judge(engine, deployment, obs, now)
            if engine.deployment_id in self.engines and engine.phase in ("starting", "ready", "degraded"):
                engines_live.append(self.live_record(engine, deployment, obs, now))
            for report in obs.sim_gpus:
                sim_reports.setdefault(int(report.get("index", 0)), []).append(report)
            with contextlib.suppress(OSError):
                process.truncate_if_large(
                    Path(engine.log_path), int(self.settings["log_max_bytes"]), int(self.settings["log_keep"])
                )
        samples = self.gpus.sample(sim_reports)
        self.watch_ray_nodes()
        self.relaunch_while_away()
        if self.control_plane.ready_for_call():
            self.sync(samples, engines_live)

    def sync(self, samples: list[dict[str, Any]], engines_live: list[dict[str, Any]]) -> None:
        with self._lock:
            changes = list(self.outbox)
        batch = {
            "host": self.host_name,
            "info": self.info(),
            "gpu_inventory": None if self.inventory_sent else self.gpus.inventory(),
            "gpus": samples,
            "engines": engines_live,
            "changes": changes,
            "ray_nodes": self.node_reports(),
            # What this agent was last told; while it is still current, the answer says "unchanged".
            "generation": self.generation,
        }
        try:
            answer = self.control_plane.post("/api/agent/sync/", batch)
        except ControlPlaneUnavailable as exc:
            if self.connected:
                log.warning("control plane unreachable (%s); engines keep serving, changes are queued", exc)
            elif self.control_plane.failures == 1 and not self.ever_connected:
                log.info("waiting for the control plane (%s)", exc)
            self.connected = False
            return
        except AgentRefused as exc:
            log.error("control plane refused this agent's token: %s", exc)
            self.connected = False
            return
        if not self.connected:
            log.info("connected to the control plane (%d queued changes sent)", len(changes))
        self.connected = self.ever_connected = True
        self.inventory_sent = True
        acked = set(answer.get("acked", []))
        with self._lock:
            self.outbox = [c for c in self.outbox if c["id"] not in acked]
            self._save_outbox()
        # A routine sync's answer says "unchanged": what this host runs stands as last told.
        if not (answer.get("unchanged") and self.generation is not None):
            generation = answer.get("generation")
            self.generation = generation if isinstance(generation, int) else None
            self.settings.update(answer.get("settings", {}))
            self.deployments = {int(d["id"]): d for d in answer.get("deployments", [])}
            self.ray_plans = {int(p["deployment_id"]): p for p in answer.get("ray", [])}
        self.reconcile_ray()
        self.reconcile()
        for request in answer.get("log_requests", []):
            self.pool.submit(self.answer_log, request)

    def node_reports(self) -> list[dict[str, Any]]:
        """What the control plane gates a spanning launch on: a Ray node that joined its cluster, or a
        member host of an mp deployment that holds the files (its headless node runs or is about to)."""
        reports = {
            node.deployment_id: {
                "deployment_id": node.deployment_id,
                "role": node.role,
                "joined": node.check_joined(),
            }
            for node in list(self.ray_nodes.values())
        }
        for deployment_id in list(self.standing_by):
            reports[deployment_id] = {"deployment_id": deployment_id, "role": "worker", "joined": True}
        return list(reports.values())

    def info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "nvml": self.gpus.nvml_available,
            "gpu_note": self.gpus.nvml_error,
            "simulated_gpus": self.gpus.simulated,
            "heartbeat_seconds": self.settings["heartbeat_seconds"],
            **self.gpus.versions(),
            "vllm_version": _installed_version("vllm"),
            "llama_cpp_version": _installed_version("llama_cpp_python"),
            "queued_changes": len(self.outbox),
            "python": sys.executable,
            "model_root": str(self.model_root),
        }

    # --- acting on the control plane's answer ---

    def reconcile(self) -> None:
        """Start, stop and forget engines so the host runs what the control plane's answer says."""
        queued = {(c["kind"], c["deployment_id"], c["start_token"]) for c in self.outbox}
        for deployment_id, engine in list(self.engines.items()):
            deployment = self.deployments.get(deployment_id)
            if deployment is None or deployment["start_token"] != engine.start_token:
                # Deleted, or an engine of an earlier launch the control plane no longer knows.
                if engine.phase != "stopping":
                    log.warning(
                        "stopping engine pid %s of deployment %s: not wanted", engine.pid, deployment_id
                    )
                    engine.phase = "stopping"
                    self.pool.submit(self.stop_engine, engine, False, False)
            elif engine.phase == "adopted":
                engine.phase = {"ready": "ready", "degraded": "degraded"}.get(deployment["state"], "starting")
            elif engine.phase == "ready" and deployment["state"] == "degraded":
                # Degraded by the control plane (the host missed heartbeats): the next passing probe
                # reports the recovery.
                engine.phase = "degraded"
        for deployment_id, deployment in self.deployments.items():
            current = self.engines.get(deployment_id)
            token = deployment["start_token"]
            if current is not None and current.start_token != token:
                continue  # being stopped above
            stop_wanted = deployment["desired_state"] == "stopped" or deployment["state"] == "stopping"
            if stop_wanted:
                if current is not None and current.phase != "stopping":
                    current.phase = "stopping"
                    self.pool.submit(self.stop_engine, current, bool(deployment.get("drain")), True)
                elif (
                    current is None
                    and deployment["state"] == "stopping"
                    and ("stopped", deployment_id, token) not in queued
                ):
                    self.queue(
                        "stopped", self._ghost(deployment), message="Engine was not running.", log_tail=""
                    )
            elif deployment.get("launch") and current is None:
                if ("failed", deployment_id, token) not in queued:
                    self.launch(deployment)
            elif (
                current is None
                and deployment["state"] in ("starting", "ready", "degraded")
                and deployment.get("pid")
                and ("exited", deployment_id, token) not in queued
            ):
                self.queue(
                    "exited", self._ghost(deployment), message="The engine was gone when the agent restarted."
                )

    # --- Ray nodes of deployments that span hosts ---

    def reconcile_ray(self) -> None:
        """Start the Ray nodes the control plane wants on this host, stop the ones it no longer wants."""
        for deployment_id, node in list(self.ray_nodes.items()):
            plan = self.ray_plans.get(deployment_id)
            if (
                plan is None
                or not plan.get("wanted")
                or plan.get("role") != node.role
                or plan.get("head_address") != node.head_address
                or plan.get("backend", "ray") != node.backend
                # A headless node belongs to one launch of the head: gone with it, started anew with
                # the next.
                or (
                    node.backend == "mp"
                    and (not plan.get("launch") or plan["start_token"] != node.launch_token)
                )
            ):
                log.info("stopping the %s %s node of deployment %s", node.backend, node.role, deployment_id)
                del self.ray_nodes[deployment_id]
                self.pool.submit(ray_node.stop, node, self.engine_dir)
        with self._lock:
            queued = {(c["kind"], c["deployment_id"], c["start_token"]) for c in self.outbox}
        self.standing_by &= {d for d, p in self.ray_plans.items() if p.get("wanted")}
        for deployment_id, plan in self.ray_plans.items():
            if plan.get("wanted") and deployment_id not in self.ray_nodes:
                fetch = plan.get("fetch")
                token = str(plan.get("start_token", ""))
                if fetch and self.ray_files.get(deployment_id) != (token, str(fetch["digest"])):
                    # A member host: vLLM's workers here load the model from the path the head's
                    # command line names, so the files come first (in the pool, as an engine's fetch).
                    if ("member_fetch_failed", deployment_id, token) not in queued:
                        self._submit_ray_fetch(deployment_id, plan, fetch)
                    continue
                self.ray_files.pop(deployment_id, None)
                if plan.get("backend") == "mp":
                    # The files are here: the head's launch may go (it waits for every member to say so),
                    # and this host's headless node starts with it.
                    self.standing_by.add(deployment_id)
                    launch = plan.get("launch")
                    # One headless node per launch: one that exited is not started again for the same
                    # launch (the head cannot take it back; the next launch brings a new one).
                    if not launch or self.headless_launched.get(deployment_id) == token:
                        continue
                    self.headless_launched[deployment_id] = token
                    node = ray_node.start_headless(plan, self.engine_dir, own_argv(launch["argv"]))
                else:
                    node = ray_node.start(plan, self.engine_dir, temp_dir=self.ray_temp_dir)
                self.ray_nodes[deployment_id] = node
                log.info(
                    "started the %s %s node of deployment %s (pid %s, head %s)",
                    node.backend,
                    node.role,
                    deployment_id,
                    node.pid,
                    node.head_address,
                )

    def _submit_ray_fetch(self, deployment_id: int, plan: dict[str, Any], fetch: dict[str, Any]) -> None:
        with self._lock:
            if deployment_id in self.ray_fetching:
                return  # one fetch at a time; the next sync after it ends starts the node
            self.ray_fetching.add(deployment_id)
        self.pool.submit(self._fetch_for_ray, deployment_id, plan, fetch)

    def _fetch_for_ray(self, deployment_id: int, plan: dict[str, Any], fetch: dict[str, Any]) -> None:
        """A member host's fetch before its Ray node: on success the next sync starts the node; a refused
        fetch fails the deployment with the reason (its launch would load files this host lacks)."""
        token = str(plan.get("start_token", ""))
        try:
            refused = self._fetch_files(deployment_id, token, fetch)
            if refused:
                self.queue("member_fetch_failed", _stand_in(deployment_id, token), message=refused)
            else:
                with self._lock:
                    self.ray_files[deployment_id] = (token, str(fetch["digest"]))
        finally:
            with self._lock:
                self.ray_fetching.discard(deployment_id)

    def watch_ray_nodes(self) -> None:
        """A Ray node that exited while wanted: the control plane hears of it (the whole deployment
        restarts: vLLM cannot run with a pipeline stage missing), and the next sync starts it again."""
        for deployment_id, node in list(self.ray_nodes.items()):
            if node.alive():
                continue
            del self.ray_nodes[deployment_id]
            plan = self.ray_plans.get(deployment_id, {})
            if not plan.get("wanted"):
                continue
            if node.backend == "mp":
                # The head's engine cannot run without this node's workers: the launch it belonged to
                # crashes (a later launch's token makes a late report stale), and the next starts it anew.
                log.warning("the headless node of deployment %s exited", deployment_id)
                self.queue(
                    "member_lost",
                    _stand_in(deployment_id, node.launch_token),
                    message=f"The headless vLLM node (node rank {plan.get('stage', '?')}) on "
                    f"{self.host_name} exited.",
                    log_tail=process.tail(node.log_path, 20),
                )
                continue
            if not node.joined:
                # It never joined (the head not reachable yet, a port taken): tried again at the next sync;
                # no engine can have used it.
                log.warning(
                    "the Ray %s node of deployment %s exited before joining:\n%s",
                    node.role,
                    deployment_id,
                    process.tail(node.log_path, 10),
                )
                continue
            log.warning("the Ray %s node of deployment %s exited", node.role, deployment_id)
            self.queue(
                "ray_lost",
                _stand_in(deployment_id, str(plan.get("start_token", ""))),
                message=f"The Ray {node.role} node on {self.host_name} exited.",
                log_tail=process.tail(node.log_path, 20),
            )

    def _ghost(self, deployment: dict[str, Any]) -> LocalEngine:
        """A stand-in for a deployment's engine that does not run here, to address a change to it."""
        return LocalEngine(
            deployment_id=int(deployment["id"]),
            pid=0,
            start_token=deployment["start_token"],
            port=int(deployment["port"]),
            log_path="",
            started_at=0.0,
        )

    def launch(self, deployment: dict[str, Any]) -> None:
        """Start the deployment's engine, first fetching its files from the model store when the plan
        says so (in the pool: a fetch takes minutes, the heartbeat must not wait)."""
        fetch = deployment["launch"].get("fetch")
        if not fetch:
            self._start(deployment)
            return
        deployment_id = int(deployment["id"])
        with self._lock:
            if deployment_id in self.fetching:
                return
            self.fetching.add(deployment_id)
        self.pool.submit(self._fetch_then_start, deployment, fetch)

    def _fetch_then_start(self, deployment: dict[str, Any], fetch: dict[str, Any]) -> None:
        ghost = self._ghost(deployment)
        try:
            refused = self._fetch_files(ghost.deployment_id, ghost.start_token, fetch)
        finally:
            with self._lock:
                self.fetching.discard(ghost.deployment_id)
        if refused:
            self.queue("failed", ghost, message=refused)
            return
        current = self.deployments.get(ghost.deployment_id)
        # Still wanted with the same start token once the files are here (a stop may have come meanwhile).
        if current is not None and current.get("start_token") == ghost.start_token and current.get("launch"):
            self._start(current)

    def _fetch_files(self, deployment_id: int, start_token: str, fetch: dict[str, Any]) -> str:
        """Fetch and verify a version's files into this host's model root; "" or why it was refused.

        A completed fetch is queued as a `fetched` change (the control plane records it as a passing
        verification on this host, once per deployment, start token and host however often it is sent).
        """
        store = fetch["store"]
        started = time.time()
        try:
            result = fetch_version(
                StoreConfig(**store),
                str(fetch["digest"]),
                [WantedFile(str(p), int(size), str(sha)) for p, size, sha in fetch["files"]],
                self.model_root,
                max_bytes=int(fetch.get("max_bytes") or 0),
                in_use=set(fetch.get("in_use") or ()),
                retries=int(fetch.get("retries", 5)),
                retry_delay=float(fetch.get("retry_delay", 1.0)),
            )
        except FetchError as exc:
            return f"Model files not fetched from '{store.get('name', '')}' on {self.host_name}: {exc}"
        except Exception as exc:  # a disk error: the launch fails with it rather than the agent
            log.exception("fetching the files of deployment %s failed", deployment_id)
            return f"Model files not fetched on {self.host_name}: {type(exc).__name__}: {exc}"
        if not result.cached:
            log.info(
                "fetched deployment %s's files: %s files, %s bytes (%s resumed)",
                deployment_id,
                result.files_fetched,
                result.bytes_fetched,
                result.resumed,
            )
        self.queue(
            "fetched",
            _stand_in(deployment_id, start_token),
            fetch={
                "digest": str(fetch["digest"]),
                "files": len(fetch["files"]),
                "bytes_verified": result.bytes_verified,
                "bytes_fetched": result.bytes_fetched,
                "resumed_files": result.resumed,
                "cached": result.cached,
                "started_at": started,
                "finished_at": time.time(),
            },
        )
        return ""

    def _start(self, deployment: dict[str, Any]) -> None:
        spec = deployment["launch"]
        ghost = self._ghost(deployment)
        bind = str(deployment.get("bind_host") or "0.0.0.0")
        if not process.port_is_free(ghost.port, bind):
            self.queue(
                "failed",
                ghost,
                message=f"Refused before start: port {ghost.port} on {self.host_name} is already in use "
                "by another process; pick a free port.",
            )
            return
        record = process.start_engine(
            argv=own_argv(spec["argv"]),
            env={str(k): str(v) for k, v in spec.get("env", {}).items()},
            directory=self.engine_dir,
            deployment_id=ghost.deployment_id,
            port=ghost.port,
            start_token=ghost.start_token,
            log_keep=int(spec.get("log_keep", self.settings["log_keep"])),
        )
        engine = LocalEngine(
            deployment_id=ghost.deployment_id,
            pid=record.pid,
            start_token=ghost.start_token,
            port=ghost.port,
            log_path=record.log_path,
            started_at=record.started_at,
        )
        self.engines[engine.deployment_id] = engine
        self.launched[engine.deployment_id] = deployment
        self.queue("started", engine, pid=record.pid, log_path=record.log_path)
        log.info("launched deployment %s pid %s", engine.deployment_id, record.pid)

    # --- engines that exit while the control plane is away ---

    def _plan_relaunch(self, engine: LocalEngine) -> None:
        """An engine exited while the control plane cannot be reached: start it again as it was launched
        (same start token, so its key and the proxies' routes still hold), after the control plane's own
        backoff, at most `max_restarts` times per outage. With the control plane there, it decides."""
        deployment = self.launched.get(engine.deployment_id)
        if self.connected or deployment is None or deployment.get("start_token") != engine.start_token:
            return
        known = self.deployments.get(engine.deployment_id, deployment)
        if known.get("desired_state") != "running" or known.get("state") in ("stopping", "stopped"):
            return
        attempt = self.away_attempts.get(engine.deployment_id, 0) + 1
        limit = int(self.settings["max_restarts"])
        if attempt > limit:
            log.error(
                "deployment %s exited again while the control plane is away; gave up after %d restarts",
                engine.deployment_id,
                limit,
            )
            return
        delay = min(
            float(self.settings["restart_backoff_max_seconds"]),
            float(self.settings["restart_backoff_seconds"]) * 2 ** (attempt - 1),
        )
        self.away_attempts[engine.deployment_id] = attempt
        self.relaunch_due[engine.deployment_id] = (attempt, time.monotonic() + delay)
        log.warning(
            "deployment %s exited while the control plane is away: restart %d of %d in %.1f s",
            engine.deployment_id,
            attempt,
            limit,
            delay,
        )

    def relaunch_while_away(self) -> None:
        """Start the engines whose relaunch is due; none once the control plane answers again (the queued
        exit tells it, and it restarts the engine its own way)."""
        if self.connected:
            self.relaunch_due.clear()
            self.away_attempts.clear()
            return
        now = time.monotonic()
        for deployment_id, (attempt, due) in list(self.relaunch_due.items()):
            if due > now or deployment_id in self.engines:
                continue
            del self.relaunch_due[deployment_id]
            deployment = self.launched[deployment_id]
            bind = str(deployment.get("bind_host") or "0.0.0.0")
            if not process.port_is_free(int(deployment["port"]), bind):
                log.warning("cannot restart deployment %s: its port is taken", deployment_id)
                continue
            spec = deployment["launch"]
            record = process.start_engine(
                argv=own_argv(spec["argv"]),
                env={str(k): str(v) for k, v in spec.get("env", {}).items()},
                directory=self.engine_dir,
                deployment_id=deployment_id,
                port=int(deployment["port"]),
                start_token=str(deployment["start_token"]),
                log_keep=int(spec.get("log_keep", self.settings["log_keep"])),
            )
            engine = LocalEngine(
                deployment_id=deployment_id,
                pid=record.pid,
                start_token=str(deployment["start_token"]),
                port=int(deployment["port"]),
                log_path=record.log_path,
                started_at=record.started_at,
            )
            with self._lock:
                self.engines[deployment_id] = engine
            self.queue("relaunched", engine, pid=record.pid, log_path=record.log_path, attempt=attempt)
            log.warning(
                "restarted deployment %s (pid %s) while the control plane is away", deployment_id, record.pid
            )

    def stop_engine(self, engine: LocalEngine, drain: bool, report: bool) -> None:
        """SIGTERM (after draining in-flight requests when asked), SIGKILL after the stop timeout."""
        try:
            if drain:
                deadline = time.monotonic() + 300.0
                deployment = self.deployments.get(engine.deployment_id, {})
                while time.monotonic() < deadline and process.is_alive(engine.pid):
                    obs = observe(engine, deployment) if deployment else Observation(alive=False)
                    metrics = obs.metrics
                    if metrics is None or not (metrics.num_requests_running + metrics.num_requests_waiting):
                        break
                    time.sleep(0.5)
            if process.is_alive(engine.pid):
                forced = process.stop_engine(engine.pid, float(self.settings["stop_timeout_seconds"]))
                message = (
                    "Engine did not exit on SIGTERM within the stop timeout; killed."
                    if forced
                    else "Engine stopped gracefully."
                )
            else:
                message = "Engine was not running."
            process.forget_record(self.engine_dir, engine.deployment_id)
            if report:
                self.queue("stopped", engine, message=message, log_tail=process.tail(engine.log_path, 20))
        except Exception:
            log.exception("stopping deployment %s failed", engine.deployment_id)
        finally:
            with self._lock:
                if self.engines.get(engine.deployment_id) is engine:
                    del self.engines[engine.deployment_id]

    # --- health ---

    def judge(self, engine: LocalEngine, deployment: dict[str, Any], obs: Observation, now: float) -> None:
        """One observation -> a queued state change, a kill, or nothing (as the co-located supervisor)."""
        if engine.phase not in ("starting", "ready", "degraded"):
            return
        verdict = health.judge(
            engine,
            obs,
            phase=engine.phase,
            settings=health.HealthSettings(
                hang_seconds=float(self.settings["hang_seconds"]),
                startup_timeout_seconds=float(self.settings["startup_timeout_seconds"]),
            ),
            now=now,
            wall=time.time(),
            started_ago=time.time() - engine.started_at,
            exit_code=None if obs.alive else process.exit_code(engine.pid),
            # Asleep (the control plane put it to sleep through its dev endpoints): only its exit counts.
            asleep=deployment["state"] == "sleeping",
        )
        if verdict.kind == health.EXITED:
            self._crashed(engine, verdict.reason)
        elif verdict.kind == health.HUNG:
            self._kill_hung(engine, verdict.reason)
        elif verdict.kind == health.READY:
            kernel = self.reported_kernel(engine, deployment)
            engine.phase = "ready"
            message = health.ready_message(deployment["served_model_name"], kernel)
            self.queue("ready", engine, message=message, kernel=kernel or "")
        elif verdict.kind == health.RECOVERED:
            engine.phase = "ready"
            self.queue("ready", engine, message=verdict.reason)
        elif verdict.kind == health.DEGRADED:
            engine.phase = "degraded"
            self.queue("degraded", engine, message=verdict.reason)

    def reported_kernel(self, engine: LocalEngine, deployment: dict[str, Any]) -> str | None:
        if deployment["engine"] != "vllm" or not engine.log_path:
            return None
        return vllm_adapter.reported_quantization_kernel(
            process.tail(engine.log_path, 20_000, 4 * 1024 * 1024)
        )

    def _kill_hung(self, engine: LocalEngine, reason: str) -> None:
        process.stop_engine(engine.pid, timeout=5.0)
        self._crashed(engine, reason)

    def _crashed(self, engine: LocalEngine, reason: str) -> None:
        log_tail = process.tail(engine.log_path, 40) if engine.log_path else ""
        process.forget_record(self.engine_dir, engine.deployment_id)
        with self._lock:
            self.engines.pop(engine.deployment_id, None)
        self.queue("exited", engine, message=reason, log_tail=log_tail)
        self._plan_relaunch(engine)

    # --- telemetry ---

    def live_record(
        self, engine: LocalEngine, deployment: dict[str, Any], obs: Observation, now: float
    ) -> dict[str, Any]:
        """The engine's live record as the proxy's scorer and the console read it."""
        return {
            "ts": time.time(),
            "deployment_id": engine.deployment_id,
            "served_model_name": deployment["served_model_name"],
            "engine": deployment["engine"],
            **health.live_metrics(engine.history, obs, now, deployment.get("block_size")),
            "idle_since": engine.last_busy_wall,
        }

    # --- logs ---

    def answer_log(self, request: dict[str, Any]) -> None:
        """Send the tail of one engine's log the control plane asked for (bounded in lines and bytes)."""
        deployment_id = int(request["deployment_id"])
        engine = self.engines.get(deployment_id)
        path = Path(engine.log_path) if engine else process.log_file(self.engine_dir, deployment_id)
        lines = max(1, min(int(request.get("lines", 200)), LOG_ANSWER_MAX_LINES))
        max_bytes = max(1, min(int(request.get("max_bytes", 1024 * 1024)), LOG_ANSWER_MAX_BYTES))
        text = process.tail(path, lines, max_bytes) if path.exists() else ""
        try:
            size = path.stat().st_size
        except OSError:
            size = 0
        body = {
            "host": self.host_name,
            "request_id": request["id"],
            "deployment_id": deployment_id,
            "path": str(path) if path.exists() else "",
            "text": text,
            "truncated": size > max_bytes,
        }
        try:
            self.control_plane.post("/api/agent/logs/", body)
        except (ControlPlaneUnavailable, AgentRefused) as exc:
            log.warning("could not send the log of deployment %s: %s", deployment_id, exc)


def _stand_in(deployment_id: int, start_token: str) -> LocalEngine:
    """Addresses a change about a deployment this host runs no engine of (a Ray node, a fetch)."""
    return LocalEngine(
        deployment_id=deployment_id, pid=0, start_token=start_token, port=0, log_path="", started_at=0.0
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="inferchain node agent (talks to the control plane's agent channel; no database access)"
    )
    parser.add_argument("--host", required=True, help="Host name as registered in the console.")
    parser.add_argument(
        "--control-plane",
        default=os.environ.get(CONTROL_PLANE_ENV, "http://127.0.0.1:8000"),
        help=f"Base URL of the control plane (or {CONTROL_PLANE_ENV}).",
    )
    parser.add_argument(
        "--token-file",
        default=None,
        help="File (mode 0600) holding the host's agent token; else INFERCHAIN_AGENT_TOKEN(_FILE).",
    )
    parser.add_argument(
        "--engine-dir",
        default=None,
        help="Engine logs and state files (default: $ENGINE_LOG_DIR/<host>, else var/engines/<host>).",
    )
    parser.add_argument(
        "--model-root",
        default=os.environ.get("INFERCHAIN_MODEL_ROOT"),
        help="Where versions fetched from the model store are kept (default: <engine dir>/model-cache).",
    )
    parser.add_argument(
        "--ray-temp-dir",
        default=os.environ.get("INFERCHAIN_RAY_TEMP_DIR"),
        help="Ray's --temp-dir for a head node this host runs (default: Ray's own, /tmp/ray). Keep it "
        "short: Ray's sockets live under it and a socket path has at most 107 bytes.",
    )
    parser.add_argument("--simulated-gpus", type=int, default=None)
    parser.add_argument("--simulated-gpu-profile", default="h100-llama3-8b-fp16")
    parser.add_argument("--loglevel", default="info")
    return parser


def main(argv: list[str] | None = None) -> None:
    options = build_parser().parse_args(argv)
    logging.basicConfig(
        level=options.loglevel.upper(), format="[%(asctime)s: %(levelname)s/%(name)s] %(message)s"
    )
    token = read_token(options.token_file)
    engine_dir = Path(
        options.engine_dir or Path(os.environ.get("ENGINE_LOG_DIR", "var/engines")) / options.host
    )
    gpus = GpuSource(options.host)
    if not gpus.nvml_available:
        count = 1 if options.simulated_gpus is None else options.simulated_gpus
        gpus = GpuSource(options.host, simulated_gpu_config(options.simulated_gpu_profile, count))
        log.warning("%s Reporting %d simulated GPU(s), marked simulated.", gpus.nvml_error, count)
    agent = Agent(
        options.host,
        ControlPlane(options.control_plane, options.host, token),
        gpus,
        engine_dir,
        Path(options.model_root) if options.model_root else None,
        ray_temp_dir=options.ray_temp_dir,
    )
    log.info(
        "agent of %s: control plane %s, engines under %s", options.host, options.control_plane, engine_dir
    )
    try:
        agent.run()
    except KeyboardInterrupt:
        agent.stop_event.set()
