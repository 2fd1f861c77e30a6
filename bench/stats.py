"""Per-request timings and what a run reports from them: percentiles, throughput, goodput, the knee."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestResult:
    """One request as the client saw it. Times are seconds on the client's monotonic clock."""

    start: float
    end: float = 0.0
    ok: bool = False
    error: str = ""  # the error type ("http_429", "timeout", "connection", ...) when not ok
    first_token: float | None = None  # arrival of the first chunk that carried generated text
    token_times: list[float] = field(default_factory=list)  # arrival of every text-carrying chunk
    output_tokens: int = 0  # from the usage block when the server sends one, else chunks counted
    prompt_tokens: int = 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    @property
    def latency(self) -> float:
        return self.end - self.start

    @property
    def itls(self) -> list[float]:
        """Gaps between consecutive chunks carrying text (inter-token latency as the stream delivers it)."""
        t = self.token_times
        return [b - a for a, b in itertools.pairwise(t)]

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first (vLLM's TPOT); None for one-token answers."""
        if self.first_token is None or self.output_tokens < 2:
            return None
        return (self.end - self.first_token) / (self.output_tokens - 1)


@dataclass(frozen=True)
class Slo:
    """A request is good when it succeeded, its TTFT is under ttft_s and its TPOT under itl_s."""

    ttft_s: float = 0.5
    itl_s: float = 0.05

    def met(self, r: RequestResult) -> bool:
        if not r.ok or r.ttft is None or r.ttft > self.ttft_s:
            return False
        tpot = r.tpot
        return tpot is None or tpot <= self.itl_s


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation between order statistics (numpy's default)."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be between 0 and 100, got {q}")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _dist(values: Sequence[float]) -> dict[str, float | None]:
    return {
        "mean": (sum(values) / len(values)) if values else None,
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
    }


def summarize(results: Sequence[RequestResult], duration_s: float, slo: Slo) -> dict[str, Any]:
    """What one load level reports. Throughputs are over duration_s (the level's wall time)."""
    done = [r for r in results if r.ok]
    ttfts = [r.ttft for r in done if r.ttft is not None]
    itls = [gap for r in done for gap in r.itls]
    tpots = [t for r in done if (t := r.tpot) is not None]
    good = sum(1 for r in results if slo.met(r))
    out_tokens = sum(r.output_tokens for r in done)
    d = duration_s if duration_s > 0 else float("nan")
    return {
        "requests": len(results),
        "ok": len(done),
        "errors": dict(Counter(r.error or "unknown" for r in results if not r.ok)),
        "duration_s": duration_s,
        "requests_per_s": len(done) / d,
        "output_tokens_per_s": out_tokens / d,
        "goodput_requests_per_s": good / d,
        "slo_met_share": good / len(results) if results else None,
        "ttft_s": _dist(ttfts),
        "itl_s": _dist(itls),
        "tpot_s": _dist(tpots),
        "latency_s": _dist([r.latency for r in done]),
    }


def find_knee(
    levels: Sequence[dict[str, Any]], *, metric: str = "latency_s", rise: float = 2.0
) -> int | None:
    """Index of the last level before latency leaves its floor, or None while it has not yet.

    The floor is the lowest p50 of `metric` over the levels so far; latency has left it at the first
    level whose p50 exceeds `rise` times the floor. That level's predecessor is the knee: the most
    load this deployment takes before its latency climbs. Levels with no successful request count as
    past the knee (the service stopped answering).
    """
    floor = math.inf
    for i, level in enumerate(levels):
        p50 = (level.get(metric) or {}).get("p50")
        if p50 is None:
            return i - 1 if i > 0 else None
        if p50 > rise * floor:
            return i - 1
        floor = min(floor, p50)
    return None
