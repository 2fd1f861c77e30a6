"""The health rules both agents share (nodes/agent/health.py): each verdict fires exactly when its rule
says, and not a tick before; the live record's rates come from the window's bucket deltas."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from nodes.agent import health
from nodes.agent.health import EngineTrack, HealthSettings, Observation
from nodes.engines.metrics import EngineMetrics

SETTINGS = HealthSettings(hang_seconds=30.0, startup_timeout_seconds=900.0)
NOW = 10_000.0
WALL = 1_700_000_000.0


def metrics(tokens: float, running: float = 0.0, waiting: float = 0.0) -> EngineMetrics:
    return EngineMetrics(
        num_requests_running=running, num_requests_waiting=waiting, generation_tokens_total=tokens
    )


PASSES = Observation(alive=True, health_ok=True, ready=True, metrics=metrics(100))
NOT_LISTED = Observation(alive=True, health_ok=True, error="/v1/models answered 200 without 'm'")
SILENT = Observation(alive=True, error="TimeoutError: timed out")
DEAD = Observation(alive=False)


@dataclass
class Case:
    name: str
    obs: Observation
    kind: str
    reason: str = ""
    phase: str = "ready"
    track: dict[str, Any] = field(default_factory=dict)
    started_ago: float = 0.0
    exit_code: int | None = None
    asleep: bool = False
    failures_after: int | None = None


CASES = [
    # Start-up.
    Case("starting engine passes its probes", PASSES, health.READY, phase="starting"),
    Case(
        "starting, not listed yet, at the timeout",
        NOT_LISTED,
        health.NOTHING,
        phase="starting",
        started_ago=900,
    ),
    Case(
        "starting, not listed after the timeout",
        NOT_LISTED,
        health.HUNG,
        "Not ready after 900 s (/v1/models answered 200 without 'm').",
        phase="starting",
        started_ago=900.5,
    ),
    Case(
        "starting, no answer after the timeout",
        Observation(alive=True),
        health.HUNG,
        "Not ready after 900 s (no answer).",
        phase="starting",
        started_ago=901,
    ),
    Case(
        "starting engine neither counts failures nor degrades",
        NOT_LISTED,
        health.NOTHING,
        phase="starting",
        track={"readiness_failures": 5},
        failures_after=5,
    ),
    # Exit.
    Case(
        "exit during start-up",
        DEAD,
        health.EXITED,
        "The engine exited with code 1 during start-up.",
        phase="starting",
        exit_code=1,
    ),
    Case("exit of a ready engine, code unknown", DEAD, health.EXITED, "The engine exited."),
    Case(
        "exit while asleep", DEAD, health.EXITED, "The engine exited with code -9.", exit_code=-9, asleep=True
    ),
    # Passing probes.
    Case("ready engine passes", PASSES, health.PASSING, track={"readiness_failures": 2}, failures_after=0),
    Case(
        "degraded engine passes again",
        PASSES,
        health.RECOVERED,
        "Recovered: probes pass again.",
        phase="degraded",
    ),
    Case("sleeping (supervisor) engine passes", PASSES, health.PASSING, phase="sleeping"),
    # Readiness failures.
    Case("second failure", NOT_LISTED, health.NOTHING, track={"readiness_failures": 1}, failures_after=2),
    Case(
        "third failure degrades",
        NOT_LISTED,
        health.DEGRADED,
        "Not ready: /v1/models answered 200 without 'm'",
        track={"readiness_failures": 2},
        failures_after=3,
    ),
    Case(
        "degraded engine failing again",
        NOT_LISTED,
        health.NOTHING,
        phase="degraded",
        track={"readiness_failures": 5},
        failures_after=6,
    ),
    Case(
        "sleeping (supervisor) engine failing never degrades",
        NOT_LISTED,
        health.NOTHING,
        phase="sleeping",
        track={"readiness_failures": 2},
        failures_after=3,
    ),
    Case(
        "probes miss but tokens move",
        Observation(alive=True, metrics=metrics(600, running=200), error="timeout"),
        health.NOTHING,
        track={"readiness_failures": 2, "last_tokens": 500.0},
        failures_after=0,
    ),
    # Progress.
    Case(
        "running requests, frozen tokens, exactly the hang time",
        Observation(alive=True, health_ok=True, ready=True, metrics=metrics(500, running=2)),
        health.PASSING,
        track={"last_tokens": 500.0, "last_progress": NOW - 30},
    ),
    Case(
        "running requests, frozen tokens, past the hang time",
        Observation(alive=True, health_ok=True, ready=True, metrics=metrics(500, running=2)),
        health.HUNG,
        "Hung: 2 running requests but no token progress for 30 s.",
        track={"last_tokens": 500.0, "last_progress": NOW - 30.5},
    ),
    Case(
        # An engine that stopped scheduling admits nothing: new requests wait while nothing runs.
        "waiting requests, none running, frozen tokens, past the hang time",
        Observation(alive=True, health_ok=True, ready=True, metrics=metrics(500, waiting=1)),
        health.HUNG,
        "Hung: 0 running and 1 waiting requests but no token progress for 30 s.",
        track={"last_tokens": 500.0, "last_progress": NOW - 30.5},
    ),
    Case(
        "waiting requests, none running, frozen tokens, within the hang time",
        Observation(alive=True, health_ok=True, ready=True, metrics=metrics(500, waiting=1)),
        health.PASSING,
        track={"last_tokens": 500.0, "last_progress": NOW - 29},
    ),
    Case(
        "idle engine with frozen tokens is no hang",
        Observation(alive=True, health_ok=True, ready=True, metrics=metrics(500)),
        health.PASSING,
        track={"last_tokens": 500.0, "last_progress": NOW - 300, "last_answer": NOW - 300},
    ),
    Case(
        "no metrics (llama.cpp): an answer is progress",
        Observation(alive=True, health_ok=True, ready=True),
        health.PASSING,
        track={"last_progress": NOW - 300},
    ),
    # Both clocks stop together when nothing answers, and the progress rule is checked first.
    Case(
        "silent past the hang time",
        SILENT,
        health.HUNG,
        "Hung: 0 running requests but no token progress for 30 s.",
        track={"last_progress": NOW - 31, "last_answer": NOW - 31},
    ),
    Case(
        "no answer past the hang time",
        SILENT,
        health.HUNG,
        "Hung: no answer to any probe for 30 s (TimeoutError: timed out).",
        track={"last_progress": NOW - 1, "last_answer": NOW - 31},
    ),
    Case(
        "silent within the hang time",
        SILENT,
        health.NOTHING,
        track={"last_progress": NOW - 29, "last_answer": NOW - 29},
        failures_after=1,
    ),
    # Asleep (the fleet agent's control plane put it to sleep).
    Case(
        "asleep with queued requests and stale clocks",
        Observation(alive=True, health_ok=True, ready=True, metrics=metrics(500, running=3, waiting=4)),
        health.NOTHING,
        track={"last_tokens": 500.0, "last_progress": NOW - 300, "last_answer": NOW - 300},
        asleep=True,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_rule_fires_exactly_when_it_should(case: Case) -> None:
    track = EngineTrack(**{"last_answer": NOW, "last_progress": NOW, **case.track})
    verdict = health.judge(
        track,
        case.obs,
        phase=case.phase,
        settings=SETTINGS,
        now=NOW,
        wall=WALL,
        started_ago=case.started_ago,
        exit_code=case.exit_code,
        asleep=case.asleep,
    )
    assert (verdict.kind, verdict.reason) == (case.kind, case.reason)
    if case.failures_after is not None:
        assert track.readiness_failures == case.failures_after


def test_asleep_resets_the_clocks_and_records_nothing() -> None:
    track = EngineTrack(last_answer=NOW - 300, last_progress=NOW - 300, last_tokens=500.0, last_busy_wall=1.0)
    obs = Observation(alive=True, metrics=metrics(500, running=3))
    kwargs: dict[str, Any] = {"phase": "ready", "settings": SETTINGS, "wall": WALL, "started_ago": 0.0}
    assert health.judge(track, obs, now=NOW, asleep=True, **kwargs).kind == health.NOTHING
    assert (track.last_answer, track.last_progress, track.history, track.last_busy_wall) == (
        NOW,
        NOW,
        [],
        1.0,
    )
    # Awake again with the same frozen counters: the hang time counts from the last asleep tick.
    assert health.judge(track, obs, now=NOW + 30, **kwargs).kind == health.NOTHING
    verdict = health.judge(track, obs, now=NOW + 30.5, **kwargs)
    assert verdict == health.Verdict(health.HUNG, "Hung: 3 running requests but no token progress for 30 s.")


def test_track_keeps_the_window_and_the_last_busy_time() -> None:
    track = EngineTrack(last_answer=NOW, last_progress=NOW, last_busy_wall=1.0)
    kwargs: dict[str, Any] = {"phase": "ready", "settings": SETTINGS, "started_ago": 0.0}
    idle = Observation(alive=True, health_ok=True, ready=True, metrics=metrics(0))
    health.judge(track, idle, now=NOW, wall=WALL, **kwargs)
    assert track.last_busy_wall == 1.0  # nothing running, waiting or moving
    waiting = Observation(alive=True, health_ok=True, ready=True, metrics=metrics(0, waiting=1))
    health.judge(track, waiting, now=NOW + 5, wall=WALL + 5, **kwargs)
    assert track.last_busy_wall == WALL + 5
    health.judge(track, idle, now=NOW + 12, wall=WALL + 12, **kwargs)
    # RATE_WINDOW_SECONDS (10 s) + 1: the first sample (12 s old) left the window.
    assert [t for t, _ in track.history] == [NOW + 5, NOW + 12]


def test_live_metrics_rates_over_the_window() -> None:
    first = EngineMetrics(
        generation_tokens_total=1000, ttft_buckets=[(0.1, 10.0), (1.0, 10.0), (float("inf"), 10.0)]
    )
    latest = EngineMetrics(
        generation_tokens_total=1500,
        num_requests_running=2,
        block_size=16,
        ttft_buckets=[(0.1, 10.0), (1.0, 20.0), (float("inf"), 20.0)],
    )
    obs = Observation(alive=True, health_ok=True, ready=True, metrics=latest)
    record = health.live_metrics([(NOW - 10, first), (NOW, latest)], obs, NOW, block_size=32)
    assert record["tokens_per_s"] == 50.0
    # The window's 10 new requests all took between 0.1 and 1.0 s: the lifetime's fast ones do not count.
    assert record["ttft_p50_s"] is not None and 0.1 < record["ttft_p50_s"] <= 1.0
    assert record["itl_p50_s"] is None  # no ITL histogram at all
    assert (record["block_size"], record["num_requests_running"], record["has_metrics"]) == (16, 2, True)


def test_live_metrics_of_an_idle_engine_fall_back_to_the_lifetime() -> None:
    buckets = [(0.1, 10.0), (1.0, 10.0), (float("inf"), 10.0)]
    same = EngineMetrics(generation_tokens_total=1000, ttft_buckets=buckets)
    obs = Observation(alive=True, health_ok=True, ready=True, metrics=same)
    record = health.live_metrics([(NOW - 5, same), (NOW, same)], obs, NOW, block_size=32)
    assert record["tokens_per_s"] == 0.0
    assert record["ttft_p50_s"] is not None and record["ttft_p50_s"] <= 0.1
    assert record["block_size"] == 32  # the engine reports none
    no_metrics = health.live_metrics([], Observation(alive=True), NOW, block_size=None)
    assert (no_metrics["has_metrics"], no_metrics["tokens_per_s"], no_metrics["ttft_p50_s"]) == (
        False,
        0.0,
        None,
    )
