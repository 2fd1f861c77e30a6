"""An engine's health rules and live record, shared by both agents: the co-located supervisor
(nodes/agent/supervisor.py, which writes the verdicts through nodes.lifecycle.transition) and the fleet
agent (nodes/agent/remote.py, which queues them for the control plane).

Health has three parts, so that a busy engine is never marked dead and a hung one is:
- liveness: the process exists (and /health answers);
- readiness: /v1/models lists the served name (with the engine key);
- progress: while requests are running or waiting, the engine's token counters move.
A failed probe alone never kills an engine; a dead process, or no progress (and no answer) for the hang
time, does.

Standard library and the engine adapters only: the fleet agent imports this and must not import Django
or the control plane (pyproject's import contract "fleet-agent-without-database").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from nodes.engines import get_adapter
from nodes.engines.metrics import EngineMetrics, bucket_delta, histogram_quantile, merge_buckets
from nodes.probes import get_json, http_get, lists_model

PROBE_TIMEOUT = 1.0
# Readiness must fail this many ticks in a row (with no token progress) before ready -> degraded.
DEGRADE_AFTER_FAILURES = 3
# Window over which tokens/s and the TTFT/ITL medians are computed.
RATE_WINDOW_SECONDS = 10.0

# What `judge` found (Verdict.kind).
READY = "ready"  # a starting engine passes its probes
RECOVERED = "recovered"  # a degraded engine passes them again
PASSING = "passing"  # a ready (or sleeping) engine passes them: nothing changes
DEGRADED = "degraded"  # a ready engine failed readiness DEGRADE_AFTER_FAILURES ticks in a row
HUNG = "hung"  # to be killed: no progress, no answer, or not ready after the start-up timeout
EXITED = "exited"  # the process is gone
NOTHING = "nothing"  # no change (still starting, a failed probe below the threshold, asleep)


@dataclass
class Observation:
    """One tick's probes of one engine."""

    alive: bool
    health_ok: bool = False
    ready: bool = False
    metrics: EngineMetrics | None = None
    sim_gpus: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""


@dataclass
class EngineTrack:
    """What an agent remembers about one engine between ticks, for the health rules and the live record."""

    # Monotonic times of the last answer to any probe and of the last token progress (or of no request
    # running, which needs none).
    last_answer: float = field(default_factory=time.monotonic)
    last_progress: float = field(default_factory=time.monotonic)
    last_tokens: float | None = None
    readiness_failures: int = 0
    # (monotonic time, metrics) of the last RATE_WINDOW_SECONDS, for tokens/s and the TTFT/ITL windows.
    history: list[tuple[float, EngineMetrics]] = field(default_factory=list)
    # Wall time the engine last had a request running or waiting (or moved tokens): idle sleep counts
    # from here (see nodes/sleep.py).
    last_busy_wall: float = field(default_factory=time.time)


@dataclass(frozen=True)
class HealthSettings:
    """The agent's settings the rules read (NODE_HANG_SECONDS and NODE_STARTUP_TIMEOUT_SECONDS)."""

    hang_seconds: float
    startup_timeout_seconds: float


@dataclass(frozen=True)
class Verdict:
    """What one observation means for the engine; `reason` is the message its state change carries."""

    kind: str
    reason: str = ""


def probe(
    address: str, port: int, *, engine: str, served_model_name: str, api_key: str | None
) -> Observation:
    """Probe one engine whose process runs: /health, /v1/models, /metrics (and the simulator's GPUs).
    Never raises."""
    adapter = get_adapter(engine)
    obs = Observation(alive=True)
    health = http_get(address, port, adapter.health_path, timeout=PROBE_TIMEOUT)
    obs.health_ok = health.ok
    if not health.ok:
        obs.error = health.error or f"{adapter.health_path} answered {health.status}"
    else:
        models = http_get(address, port, adapter.models_path, timeout=PROBE_TIMEOUT, api_key=api_key)
        obs.ready = lists_model(models, served_model_name)
        if not obs.ready:
            missing = f"{adapter.models_path} answered {models.status} without '{served_model_name}'"
            obs.error = models.error or missing
    if adapter.metrics_path is not None:
        scraped = http_get(address, port, adapter.metrics_path, timeout=PROBE_TIMEOUT, api_key=api_key)
        if scraped.ok:
            try:
                obs.metrics = adapter.parse_metrics(scraped.body.decode("utf-8", errors="replace"))
            except ValueError as exc:
                obs.error = obs.error or f"unreadable /metrics: {exc}"
    if engine == "sim":
        data = get_json(address, port, "/sim/gpu", timeout=PROBE_TIMEOUT, api_key=api_key)
        if isinstance(data, dict) and isinstance(data.get("gpus"), list):
            obs.sim_gpus = [g for g in data["gpus"] if isinstance(g, dict)]
    return obs


def judge(
    track: EngineTrack,
    obs: Observation,
    *,
    phase: str,
    settings: HealthSettings,
    now: float,
    wall: float,
    started_ago: float,
    exit_code: int | None = None,
    asleep: bool = False,
) -> Verdict:
    """One tick's observation of an engine -> what it means. Updates `track`; does no I/O.

    `phase`: the engine's state as the agent knows it ("starting", "ready", "degraded"; any other, such
    as "sleeping", is judged as a running engine that neither degrades nor recovers). `now`: monotonic
    time; `wall`: time.time(); `started_ago`: wall seconds since the engine was started; `exit_code`: the
    process's, when it is gone and known. `asleep`: put to sleep by the control plane, so requests queue
    and no token moves, which is no hang: only its exit counts.
    """
    if asleep and obs.alive:
        track.last_answer = track.last_progress = now
        return Verdict(NOTHING)
    if not obs.alive:
        how = f" with code {exit_code}" if exit_code is not None else ""
        when = " during start-up" if phase == "starting" else ""
        return Verdict(EXITED, f"The engine exited{how}{when}.")

    metrics = obs.metrics
    answered = obs.health_ok or metrics is not None
    if answered:
        track.last_answer = now
    moved = False
    if metrics is not None:
        tokens = metrics.tokens_processed
        moved = track.last_tokens is not None and tokens != track.last_tokens
        # Idle is progress enough; requests that wait while nothing runs are not: an engine that stopped
        # scheduling admits nothing new, so they wait with no token moving (and running stays 0).
        if moved or (metrics.num_requests_running == 0 and metrics.num_requests_waiting == 0):
            track.last_progress = now
        track.last_tokens = tokens
        if moved or metrics.num_requests_running or metrics.num_requests_waiting:
            track.last_busy_wall = wall
        track.history.append((now, metrics))
        track.history = [(t, m) for t, m in track.history if now - t <= RATE_WINDOW_SECONDS + 1]
    elif answered:
        # No metrics to read (llama.cpp): answering is the only progress evidence there is.
        track.last_progress = now

    if phase == "starting":
        if obs.health_ok and obs.ready:
            return Verdict(READY)
        timeout = settings.startup_timeout_seconds
        if started_ago > timeout:
            return Verdict(HUNG, f"Not ready after {timeout:.0f} s ({obs.error or 'no answer'}).")
        return Verdict(NOTHING)

    hang = settings.hang_seconds
    running = metrics.num_requests_running if metrics is not None else 0.0
    waiting = metrics.num_requests_waiting if metrics is not None else 0.0
    if now - track.last_progress > hang:
        queued = f" and {waiting:.0f} waiting" if waiting else ""
        return Verdict(
            HUNG, f"Hung: {running:.0f} running{queued} requests but no token progress for {hang:.0f} s."
        )
    if now - track.last_answer > hang:
        return Verdict(HUNG, f"Hung: no answer to any probe for {hang:.0f} s ({obs.error}).")

    if obs.health_ok and obs.ready:
        track.readiness_failures = 0
        if phase == "degraded":
            return Verdict(RECOVERED, "Recovered: probes pass again.")
        return Verdict(PASSING)
    if moved:
        # Too busy to answer a probe in time, but tokens flow: working, not dead.
        track.readiness_failures = 0
        return Verdict(NOTHING)
    track.readiness_failures += 1
    if track.readiness_failures >= DEGRADE_AFTER_FAILURES and phase == "ready":
        return Verdict(DEGRADED, f"Not ready: {obs.error}")
    return Verdict(NOTHING)


def ready_message(served_model_name: str, kernel: str | None) -> str:
    """The reason a starting engine's move to ready carries (with the quantization kernel it reports)."""
    note = f" The engine reports quantization kernel {kernel}." if kernel else ""
    return f"Ready: /health answers and /v1/models lists '{served_model_name}'.{note}"


def live_metrics(
    history: list[tuple[float, EngineMetrics]], obs: Observation, now: float, block_size: Any
) -> dict[str, Any]:
    """The probe and metrics fields of an engine's live record, as the proxy's scorer and the console read
    them: rates over the history's window (`now` monotonic), `block_size` when the engine reports none."""
    m = obs.metrics or EngineMetrics()
    tokens_per_s = 0.0
    ttft_window, itl_window = m.ttft_buckets, m.itl_buckets
    if len(history) >= 2:
        t0, first = history[0]
        dt = now - t0
        if dt > 0:
            tokens_per_s = max(0.0, (m.generation_tokens_total - first.generation_tokens_total) / dt)
        ttft_window = bucket_delta(m.ttft_buckets, first.ttft_buckets)
        itl_window = bucket_delta(m.itl_buckets, first.itl_buckets)
    # Over the window when it saw requests, else over the engine's lifetime (an idle engine).
    ttft, ttft_p95 = _quantiles(ttft_window, m.ttft_buckets)
    itl, itl_p95 = _quantiles(itl_window, m.itl_buckets)
    return {
        "alive": obs.alive,
        "ready": obs.ready,
        "num_requests_running": m.num_requests_running,
        "num_requests_waiting": m.num_requests_waiting,
        "kv_cache_usage_perc": m.kv_cache_usage_perc,
        "num_gpu_blocks": m.num_gpu_blocks,
        "block_size": m.block_size or block_size,
        "kv_cache_total_tokens": m.kv_cache_total_tokens,
        "prompt_tokens_total": m.prompt_tokens_total,
        "generation_tokens_total": m.generation_tokens_total,
        "prefix_cache_queries_total": m.prefix_cache_queries_total,
        "prefix_cache_hits_total": m.prefix_cache_hits_total,
        "tokens_per_s": round(tokens_per_s, 2),
        "ttft_p50_s": ttft,
        "itl_p50_s": itl,
        "ttft_p95_s": ttft_p95,
        "itl_p95_s": itl_p95,
        "has_metrics": obs.metrics is not None,
    }


def _quantiles(window: Any, lifetime: Any) -> tuple[float | None, float | None]:
    """(p50, p95) of the window's histogram, or of the lifetime one when the window saw nothing."""
    p50 = histogram_quantile(0.5, window)
    if p50 is None:
        window = merge_buckets([lifetime])
        p50 = histogram_quantile(0.5, window)
    return p50, histogram_quantile(0.95, window)
