"""Load levels (closed loop: N clients; open loop: Poisson arrivals at a rate) and the sweep over them."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench.client import BenchError, preflight, send
from bench.stats import RequestResult, Slo, find_knee, summarize
from bench.workload import WorkItem

# Errors that mean the run is hopeless rather than the target overloaded: stop at once, not after a
# sweep of them.
_FATAL = {"connection", "http_401", "http_403", "http_404"}
_FATAL_AFTER = 5


@dataclass(frozen=True)
class Level:
    """One load level: `clients` concurrent clients (closed loop) or `rate` requests/s (open loop)."""

    clients: int | None = None
    rate: float | None = None

    @property
    def label(self) -> str:
        return f"{self.clients} clients" if self.clients is not None else f"{self.rate:g} req/s"

    def as_dict(self) -> dict[str, Any]:
        return {"clients": self.clients, "rate": self.rate}


@dataclass
class Plan:
    """What to run: the target, the workload and the levels, with the limits of each level."""

    target: str
    key: str | None
    model: str | None
    items: Sequence[WorkItem]
    levels: Sequence[Level]
    requests_per_level: int = 100
    max_seconds_per_level: float = 120.0
    timeout_s: float = 120.0
    slo: Slo = field(default_factory=Slo)
    stop_past_knee: bool = True
    knee_rise: float = 2.0
    seed: int = 0
    extra_body: dict[str, Any] | None = None


@dataclass
class Report:
    """Filled in as the run goes, so an interrupted run still has every finished request."""

    plan: Plan
    model: str = ""
    levels: list[dict[str, Any]] = field(default_factory=list)
    current: Level | None = None
    current_results: list[RequestResult] = field(default_factory=list)
    current_started: float = 0.0
    interrupted: bool = False
    stopped: str = ""

    def close_current(self) -> None:
        """Summarize the level in progress (after an interruption) with what finished of it."""
        if self.current is not None and self.current_results:
            elapsed = time.perf_counter() - self.current_started
            self.levels.append(
                {
                    **self.current.as_dict(),
                    "partial": True,
                    **summarize(self.current_results, elapsed, self.plan.slo),
                }
            )
        self.current = None

    def as_dict(self) -> dict[str, Any]:
        p = self.plan
        knee = find_knee(self.levels, rise=p.knee_rise)
        return {
            "target": p.target,
            "model": self.model,
            "slo": {"ttft_s": p.slo.ttft_s, "itl_s": p.slo.itl_s},
            "requests_per_level": p.requests_per_level,
            "workload_size": len(p.items),
            "seed": p.seed,
            "interrupted": self.interrupted,
            "stopped": self.stopped,
            "knee_index": knee,
            "knee": None if knee is None else {k: self.levels[knee][k] for k in ("clients", "rate")},
            "levels": self.levels,
        }


ProgressFactory = Callable[[int, str], Any]


def _check_fatal(results: list[RequestResult]) -> None:
    finished = [r for r in results if r.end]
    if len(finished) >= _FATAL_AFTER and all(r.error in _FATAL for r in finished[:_FATAL_AFTER]):
        raise BenchError(f"the first {_FATAL_AFTER} requests all failed with {finished[0].error}; stopping")


async def _closed_loop(
    session: aiohttp.ClientSession,
    plan: Plan,
    report: Report,
    clients: int,
    items: itertools.cycle[WorkItem],
    bar: Any,
) -> None:
    deadline = time.perf_counter() + plan.max_seconds_per_level
    remaining = plan.requests_per_level

    async def client() -> None:
        nonlocal remaining
        while remaining > 0 and time.perf_counter() < deadline:
            remaining -= 1
            r = await send(
                session, plan.target, plan.key, report.model, next(items), plan.timeout_s, plan.extra_body
            )
            report.current_results.append(r)
            bar.update(1)
            _check_fatal(report.current_results)

    # A TaskGroup cancels the other clients when one stops the run (a fatal error).
    async with asyncio.TaskGroup() as group:
        for _ in range(clients):
            group.create_task(client())


async def _open_loop(
    session: aiohttp.ClientSession,
    plan: Plan,
    report: Report,
    rate: float,
    items: itertools.cycle[WorkItem],
    bar: Any,
) -> None:
    rng = random.Random(plan.seed)
    deadline = time.perf_counter() + plan.max_seconds_per_level

    async def one(item: WorkItem) -> None:
        r = await send(session, plan.target, plan.key, report.model, item, plan.timeout_s, plan.extra_body)
        report.current_results.append(r)
        bar.update(1)

    next_at = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(plan.requests_per_level):
            next_at += rng.expovariate(rate)
            if next_at > deadline:
                break
            delay = next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            group.create_task(one(next(items)))
            _check_fatal(report.current_results)


async def run(plan: Plan, report: Report, progress: ProgressFactory) -> Report:
    """Run every level in turn (stopping one level past the knee when asked); fills `report`."""
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        report.model = await preflight(session, plan.target, plan.key, plan.model)
        for level in plan.levels:
            items = itertools.cycle(plan.items)
            report.current, report.current_results = level, []
            report.current_started = time.perf_counter()
            bar = progress(plan.requests_per_level, level.label)
            try:
                if level.clients is not None:
                    await _closed_loop(session, plan, report, level.clients, items, bar)
                else:
                    assert level.rate is not None
                    await _open_loop(session, plan, report, level.rate, items, bar)
            finally:
                bar.close()
            elapsed = time.perf_counter() - report.current_started
            report.levels.append({**level.as_dict(), **summarize(report.current_results, elapsed, plan.slo)})
            report.current = None
            if plan.stop_past_knee and find_knee(report.levels, rise=plan.knee_rise) is not None:
                report.stopped = f"latency left its floor at {level.label}"
                break
    return report
