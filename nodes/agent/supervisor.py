"""The agent's loops: once per NODE_TELEMETRY_SECONDS, probe every engine on the host, judge its health,
restart crashed ones when their backoff is due, and publish what the engines said; and, on a clock of
its own at the same period, sample the GPUs, publish them and send the heartbeat.

The GPU clock is separate because an engine round lasts as long as its slowest probe (health, models
and metrics, each with a 1 s timeout): one engine that is starting or hung used to stretch the whole
host's GPU feed to one sample every 3-4 s, and its heartbeat with it. The GPU loop reuses the last
engine round's simulator reports and engine records, so a GPU sample is never late for an engine.

The health rules (liveness, readiness, progress) and the live record are nodes/agent/health.py's, shared
with the fleet agent; this module acts on their verdicts through transition().
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

from core.live import FLEET_GROUP, deployment_group, host_group
from core.redis_client import get_redis
from nodes import history, process
from nodes.agent import health, runtime
from nodes.agent.gpus import GpuSource
from nodes.agent.health import EngineTrack, Observation
from nodes.agent.services import installed_version, record_heartbeat, report_gpus
from nodes.choices import DeploymentState, DesiredState
from nodes.lifecycle import (
    engine_api_key,
    live_deployment_key,
    live_gpu_key,
    push_event,
    transition,
    wake_requested,
)
from nodes.models import Deployment, Host

log = logging.getLogger(__name__)

# A deployment pending (or verifying, with nobody holding its lock) this long gets launched by the
# supervisor: its queued task went missing.
STALLED_LAUNCH_SECONDS = 30.0
# While some engine of the host sleeps, its wake keys are read this often (one MGET), so a request the
# proxy holds waits for the wake-up itself, not for the next engine round.
WAKE_POLL_SECONDS = 0.1
SUPERVISED_STATES = (
    DeploymentState.STARTING,
    DeploymentState.READY,
    DeploymentState.DEGRADED,
    DeploymentState.SLEEPING,
)


@dataclass(kw_only=True)
class Track(EngineTrack):
    """What the supervisor remembers about one engine between ticks: its health track, for one start."""

    start_token: str


def observe(deployment: Deployment) -> Observation:
    """Probe one engine. Never raises."""
    if not deployment.pid or not process.is_alive(deployment.pid):
        return Observation(alive=False)
    return health.probe(
        deployment.host.address,
        deployment.port,
        engine=str(deployment.engine),
        served_model_name=deployment.served_model_name,
        # Every engine path but /health wants the engine key (nodes/engines/guard.py).
        api_key=engine_api_key(deployment),
    )


class Supervisor:
    """Supervision, telemetry and heartbeats for one host. `tick()` does one round; `run()` loops."""

    def __init__(self, host_name: str, gpu_source: GpuSource | None = None) -> None:
        self.host_name = host_name
        self.gpus = gpu_source or GpuSource(host_name)
        self.tracks: dict[int, Track] = {}
        self.last_heartbeat = 0.0
        self.stop_event = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"probe-{host_name}")
        self.loop: threading.Thread | None = None
        self.last_gpu_samples: list[dict[str, Any]] = []
        self.gpu_loop: threading.Thread | None = None
        # The last engine round's results, for the GPU clock (written by one thread, read by the other).
        self._latest_lock = threading.Lock()
        self._latest_sim_reports: dict[int, list[dict[str, Any]]] = {}
        self._latest_engines: list[dict[str, Any]] = []
        # Deployments a wake-up is running for (submitted to the pool, not finished yet), and the host's
        # sleeping ones as the last engine round saw them (for the wake watch).
        self.waking: set[int] = set()
        self.sleeping: list[int] = []
        self.wake_loop: threading.Thread | None = None

    # --- lifecycle ---

    def start(self) -> None:
        """Register GPUs, heartbeat once and re-adopt surviving engines; call before the first tick."""
        host = Host.objects.get(name=self.host_name)
        report_gpus(host, self.gpus.inventory())
        self.heartbeat(force=True)
        runtime.adopt(self.host_name)

    def run(self) -> None:
        """The engine loop; starts the GPU clock first when it is not running yet."""
        if not self._gpu_clock_running():
            self.gpu_loop = threading.Thread(target=self.run_gpus, name=f"gpus-{self.host_name}", daemon=True)
            self.gpu_loop.start()
        if self.wake_loop is None or not self.wake_loop.is_alive():
            self.wake_loop = threading.Thread(
                target=self.run_wake_watch, name=f"wake-{self.host_name}", daemon=True
            )
            self.wake_loop.start()
        interval = settings.NODE_TELEMETRY_SECONDS
        try:
            while not self.stop_event.is_set():
                began = time.monotonic()
                try:
                    close_old_connections()
                    self.tick()
                except Exception:  # one bad tick must not end supervision of the whole host
                    log.exception("supervisor tick failed on %s", self.host_name)
                self.stop_event.wait(max(0.05, interval - (time.monotonic() - began)))
        finally:
            connection.close()

    def run_gpus(self) -> None:
        """The GPU clock: a sample, its publication and the heartbeat every NODE_TELEMETRY_SECONDS.

        Scheduled on a fixed grid (not "interval after the last one ended") so the rate stays steady;
        a round that overran skips the slots it missed instead of bunching samples.
        """
        interval = settings.NODE_TELEMETRY_SECONDS
        next_at = time.monotonic()
        try:
            while not self.stop_event.is_set():
                try:
                    close_old_connections()
                    self.heartbeat()
                    self.publish_gpus()
                except Exception:  # a failed sample must not stop the clock
                    log.exception("GPU sample failed on %s", self.host_name)
                next_at += interval
                now = time.monotonic()
                if next_at < now:
                    next_at = now + interval - (now - next_at) % interval
                self.stop_event.wait(next_at - now)
        finally:
            connection.close()

    def run_wake_watch(self) -> None:
        """Between engine rounds: wake the sleeping engines someone asked for (their wake keys)."""
        while not self.stop_event.is_set():
            sleeping = list(self.sleeping)
            if sleeping:
                try:
                    for pk in wake_requested(sleeping):
                        self.submit_wake(pk, "woken on request")
                except Exception:  # the engine round checks the keys too
                    log.exception("wake watch failed on %s", self.host_name)
            self.stop_event.wait(WAKE_POLL_SECONDS)

    def submit_wake(self, pk: int, reason: str) -> None:
        if pk in self.waking:
            return
        self.waking.add(pk)
        future = self.pool.submit(_in_own_connection, runtime.wake, pk, reason)
        future.add_done_callback(partial(_discard, self.waking, pk))

    def _gpu_clock_running(self) -> bool:
        return self.gpu_loop is not None and self.gpu_loop.is_alive()

    def heartbeat(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_heartbeat < settings.NODE_HEARTBEAT_SECONDS:
            return
        self.last_heartbeat = now
        info = {
            "pid": os.getpid(),
            "nvml": self.gpus.nvml_available,
            "gpu_note": self.gpus.nvml_error,
            "simulated_gpus": self.gpus.simulated,
            "heartbeat_seconds": settings.NODE_HEARTBEAT_SECONDS,
            **self.gpus.versions(),
            "vllm_version": installed_version("vllm"),
            "llama_cpp_version": installed_version("llama_cpp_python"),
        }
        record_heartbeat(self.host_name, info)

    # --- one round ---

    def tick(self) -> None:
        """One engine round. Without the GPU clock running (tests, one-shot callers) it also sends the
        heartbeat and publishes one GPU sample, as one call of the old single loop did."""
        clock = self._gpu_clock_running()
        if not clock:
            self.heartbeat()
        deployments = list(
            Deployment.objects.select_related("host", "model_version", "quantization").filter(
                host__name=self.host_name
            )
        )
        watched = [d for d in deployments if d.state in SUPERVISED_STATES and d.pid]
        observations = dict(zip([d.pk for d in watched], self.pool.map(observe, watched), strict=True))
        now = time.monotonic()
        engines_live: list[dict[str, Any]] = []
        sim_reports: dict[int, list[dict[str, Any]]] = {}
        for deployment in deployments:
            obs = observations.get(deployment.pk)
            if obs is not None:
                self.judge(deployment, obs, now)
                if deployment.state in SUPERVISED_STATES:
                    # A crashed/stopped engine's live key was just dropped; do not write it back.
                    engines_live.append(self.publish_engine(deployment, obs, now))
                for report in obs.sim_gpus:
                    # The simulator numbers its GPUs from --sim-gpu-index, i.e. in the host's indices.
                    sim_reports.setdefault(int(report.get("index", 0)), []).append(report)
            else:
                self.tracks.pop(deployment.pk, None)
                self.reconcile(deployment)
            if deployment.log_path and deployment.pid:
                process.truncate_if_large(
                    Path(deployment.log_path),
                    settings.ENGINE_LOG_MAX_BYTES,
                    settings.ENGINE_LOG_KEEP,
                )
        self.wake_when_asked(deployments, observations)
        with self._latest_lock:
            self._latest_sim_reports = sim_reports
            self._latest_engines = engines_live
        self.record_engine_history(engines_live)
        if not clock:
            self.publish_gpus()

    def wake_when_asked(self, deployments: list[Deployment], observations: dict[int, Observation]) -> None:
        """Wake sleeping engines someone asked for (their wake key: the proxy holding a request, the
        API), and those a request reached anyway (it waits in the engine's queue)."""
        sleeping = [d.pk for d in deployments if d.state == DeploymentState.SLEEPING]
        self.sleeping = sleeping
        if not sleeping:
            return
        asked = wake_requested(sleeping)
        for pk in sleeping:
            obs = observations.get(pk)
            queued = obs is not None and obs.metrics is not None and obs.metrics.num_requests_waiting > 0
            if pk in asked or queued:
                self.submit_wake(
                    pk, "a request is waiting" if queued and pk not in asked else "woken on request"
                )

    def reconcile(self, deployment: Deployment) -> None:
        """Deployments not being probed: restart crashed ones when due, stop unwanted ones."""
        if (
            deployment.state == DeploymentState.CRASHED
            and deployment.desired_state == DesiredState.RUNNING
            and deployment.next_restart_at is not None
            and deployment.next_restart_at <= timezone.now()
        ):
            self.pool.submit(_in_own_connection, runtime.launch, deployment.pk)
        elif (
            deployment.desired_state == DesiredState.RUNNING
            and deployment.state in (DeploymentState.PENDING, DeploymentState.VERIFYING)
            and not runtime.deployment_lock(deployment.pk).locked()
            and (timezone.now() - (deployment.state_changed_at or deployment.created_at)).total_seconds()
            > STALLED_LAUNCH_SECONDS
        ):
            # Its launch task was lost (or died mid-way): launching is idempotent, so just do it.
            self.pool.submit(_in_own_connection, runtime.launch, deployment.pk)
        elif deployment.desired_state == DesiredState.STOPPED and deployment.state == DeploymentState.CRASHED:
            transition(deployment, DeploymentState.STOPPED, "Stopped while waiting to restart.", pid=None)

    def judge(self, deployment: Deployment, obs: Observation, now: float) -> None:
        """Turn one tick's observation into a state change, a kill, or nothing."""
        track = self.tracks.get(deployment.pk)
        if track is None or track.start_token != deployment.start_token:
            track = Track(start_token=deployment.start_token, last_answer=now, last_progress=now)
            self.tracks[deployment.pk] = track
        with runtime.locked(deployment.pk, wait=False) as mine:
            if not mine:
                return  # a launch/stop task is working on it right now
            deployment.refresh_from_db()
            if deployment.state not in SUPERVISED_STATES or deployment.start_token != track.start_token:
                return
            verdict = health.judge(
                track,
                obs,
                phase=str(deployment.state),
                # Asleep, requests queue and no token moves, which is no hang; only its exit counts (as
                # in the fleet agent).
                asleep=deployment.state == DeploymentState.SLEEPING,
                settings=health.HealthSettings(
                    hang_seconds=float(settings.NODE_HANG_SECONDS),
                    startup_timeout_seconds=float(settings.NODE_STARTUP_TIMEOUT_SECONDS),
                ),
                now=now,
                wall=time.time(),
                started_ago=(timezone.now() - (deployment.started_at or timezone.now())).total_seconds(),
                exit_code=process.exit_code(deployment.pid) if not obs.alive and deployment.pid else None,
            )
            self.act(deployment, verdict)

    def act(self, deployment: Deployment, verdict: health.Verdict) -> None:
        """Carry out one verdict: a state change through transition(), a kill, or nothing."""
        if verdict.kind == health.EXITED:
            runtime.record_crash(deployment, verdict.reason)
            self.tracks.pop(deployment.pk, None)
        elif verdict.kind == health.HUNG:
            runtime.kill_hung(deployment, verdict.reason)
            self.tracks.pop(deployment.pk, None)
        elif verdict.kind == health.READY:
            kernel = runtime.reported_kernel(deployment)
            transition(
                deployment,
                DeploymentState.READY,
                health.ready_message(deployment.served_model_name, kernel),
                ready_at=timezone.now(),
                reported_quantization=kernel or "",
            )
        elif verdict.kind == health.RECOVERED:
            transition(deployment, DeploymentState.READY, verdict.reason)
            self.reset_restarts_when_stable(deployment)
        elif verdict.kind == health.PASSING:
            self.reset_restarts_when_stable(deployment)
        elif verdict.kind == health.DEGRADED:
            transition(deployment, DeploymentState.DEGRADED, verdict.reason)

    def reset_restarts_when_stable(self, deployment: Deployment) -> None:
        if deployment.restart_count and deployment.ready_at:
            stable = (timezone.now() - deployment.ready_at).total_seconds()
            if stable >= settings.NODE_STABLE_SECONDS:
                Deployment.objects.filter(pk=deployment.pk).update(restart_count=0)
                deployment.restart_count = 0

    # --- publishing ---

    def engine_live(self, deployment: Deployment, obs: Observation, now: float) -> dict[str, Any]:
        """The live record of an engine as the proxy's scorer and the UI read it."""
        track = self.tracks.get(deployment.pk)
        window = track.history if track is not None else []
        return {
            "ts": time.time(),
            "deployment_id": deployment.pk,
            "host": self.host_name,
            "name": deployment.name,
            "served_model_name": deployment.served_model_name,
            "engine": deployment.engine,
            "state": deployment.state,
            **health.live_metrics(window, obs, now, deployment.block_size),
            "idle_since": track.last_busy_wall if track is not None else None,
            "sleeping_level": deployment.sleeping_level,
        }

    def publish_engine(self, deployment: Deployment, obs: Observation, now: float) -> dict[str, Any]:
        live = self.engine_live(deployment, obs, now)
        ttl = max(1, round(settings.NODE_LIVE_TTL_SECONDS))
        try:
            get_redis().set(live_deployment_key(deployment.pk), json.dumps(live), ex=ttl)
        except Exception as exc:  # Redis down: the proxy treats missing live data as busy
            log.warning("could not write live state of deployment %s: %s", deployment.pk, exc)
        push_event([deployment_group(deployment.pk)], {"type": "deployment.metrics", **live})
        return live

    def record_engine_history(self, engines: list[dict[str, Any]]) -> None:
        """The engine round's records, kept for an hour: the console's charts start from this history."""
        if not engines:
            return
        try:
            pipe = get_redis().pipeline(transaction=False)
            history.record(pipe, self.host_name, [], engines)
            pipe.execute()
        except Exception as exc:
            log.warning("could not write engine history of %s: %s", self.host_name, exc)

    def publish_gpus(self) -> None:
        """Sample the GPUs (simulated ones from the last engine round's reports) and publish them."""
        with self._latest_lock:
            sim_reports, engines = self._latest_sim_reports, self._latest_engines
        samples = self.gpus.sample(sim_reports)
        self.last_gpu_samples = samples
        ttl = max(1, round(settings.NODE_LIVE_TTL_SECONDS))
        try:
            pipe = get_redis().pipeline(transaction=False)
            for sample in samples:
                pipe.set(live_gpu_key(self.host_name, sample["index"]), json.dumps(sample), ex=ttl)
            # Kept for an hour: the console's charts start from this history.
            history.record(pipe, self.host_name, samples, [])
            pipe.execute()
        except Exception as exc:
            log.warning("could not write GPU samples of %s: %s", self.host_name, exc)
        # One event per host per tick: the fleet dashboard and the host page both draw from it.
        # `ts` is the GPU sample time, so a browser can measure sample-to-screen latency.
        event = {
            "type": "host.telemetry",
            "host": self.host_name,
            "ts": samples[0]["ts"] if samples else time.time(),
            "simulated": self.gpus.simulated,
            "gpu_note": self.gpus.nvml_error,
            "gpus": samples,
            "engines": engines,
        }
        push_event([FLEET_GROUP, host_group(self.host_name)], event)

    def start_loop(self) -> threading.Thread:
        """Run the supervision loop in a thread of its own; `close` ends it."""
        self.loop = threading.Thread(target=self.run, name=f"supervisor-{self.host_name}", daemon=True)
        self.loop.start()
        return self.loop

    def close(self) -> list[str]:
        """Stop the loop and wait for its tick to finish before the probe pool goes.

        Without the wait, a tick still running while the process exits pushes to the browser after
        Python has shut down its executors ("cannot schedule new futures after interpreter shutdown",
        then "coroutine ... was never awaited" warnings at every Ctrl-C). Returns the names of the
        threads still running after the wait (none, normally): such a thread may still change state.
        """
        self.stop_event.set()
        me = threading.current_thread()
        threads = [t for t in (self.loop, self.gpu_loop, self.wake_loop) if t is not None and t is not me]
        for thread in threads:
            thread.join(timeout=max(10.0, 3 * settings.NODE_TELEMETRY_SECONDS))
        self.pool.shutdown(wait=True, cancel_futures=True)
        running = [t.name for t in threads if t.is_alive()]
        if running:
            log.warning("supervisor of %s: threads still running after close: %s", self.host_name, running)
        return running


def _discard(ids: set[int], pk: int, _future: Any) -> None:
    ids.discard(pk)


def _in_own_connection(func: Any, *args: Any) -> Any:
    """Run `func` in a pool thread and close that thread's database connection afterwards."""
    try:
        return func(*args)
    finally:
        connection.close()
