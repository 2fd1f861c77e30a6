"""What one history bucket keeps, and how finer buckets combine into a coarser one.

Two shapes of `MetricRollup.values`:

- gauges (a GPU, an engine): `[n, mean, mean, ...]`, the number of samples and then each field's mean
  in the kind's field order (routing/rollups/services.py GPU_FIELDS, ENGINE_FIELDS; null where no sample
  had the field). A list, not named fields: the names would be most of a point's bytes, and the
  history holds millions of points (docs/benchmarks.md "History rollup writes"). A field added later
  goes at the end; older, shorter points read as null there. Combined as means weighted by `n`.
- requests (a pool, a tenant): `{part: stats}` with part `all` (and, for a pool, `short` and `long`,
  by prompt length against PROXY_LONG_PROMPT_TOKENS). `stats` is `{"requests", "ok", "4xx", "5xx",
  "prompt_tokens", "completion_tokens", "latency", "ttft"}` where `4xx` and `5xx` count the answers of
  each status class, the tokens are those of admitted requests (routing/cost.py's rule: answered, or
  an answer under way when it failed), `latency` is a histogram of request latencies and `ttft` one of
  times to the first token (bucket index -> count, only buckets with requests; streamed answers are the
  ones with a TTFT).
  Counts and histograms add up, so a coarser bucket's percentiles are those of all its requests, not a
  mean of finer percentiles. Points written before `4xx`, `5xx` and `ttft` were kept read as zero and
  empty there: their errors (`requests - ok`) are known, their split and TTFTs are not.

Latency buckets are log-spaced, four per doubling from 1 ms (bucket i holds (2^((i-1)/4), 2^(i/4)] ms),
so a percentile read from a histogram is within 19% of the true one; 80 buckets reach 17 minutes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

STEPS_PER_DOUBLING = 4
LAST_LATENCY_BUCKET = 80
REQUEST_COUNTS = ("requests", "ok", "4xx", "5xx", "prompt_tokens", "completion_tokens")
REQUEST_HISTOGRAMS = ("latency", "ttft")


def latency_bucket(ms: float) -> int:
    """The histogram bucket of a latency in milliseconds."""
    if ms <= 1.0:
        return 0
    return min(LAST_LATENCY_BUCKET, math.ceil(STEPS_PER_DOUBLING * math.log2(ms)))


def bucket_bounds(index: int) -> tuple[float, float]:
    """(lower, upper] of a latency bucket, in milliseconds."""
    upper = 2.0 ** (index / STEPS_PER_DOUBLING)
    return (0.0 if index == 0 else 2.0 ** ((index - 1) / STEPS_PER_DOUBLING), upper)


def percentile(histogram: Mapping[str, int], q: float) -> float | None:
    """The q-quantile (0..1) of a latency histogram, interpolated inside its bucket; None when empty."""
    total = sum(histogram.values())
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for index in sorted(int(k) for k in histogram):
        count = histogram[str(index)]
        if count and seen + count >= rank:
            lower, upper = bucket_bounds(index)
            return lower + (upper - lower) * max(0.0, rank - seen) / count
        seen += count
    return bucket_bounds(LAST_LATENCY_BUCKET)[1]


def empty_requests() -> dict[str, Any]:
    return {
        "requests": 0,
        "ok": 0,
        "4xx": 0,
        "5xx": 0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "latency": {},
        "ttft": {},
    }


def add_request(
    stats: dict[str, Any],
    status: int,
    prompt_tokens: int | None,
    completion_tokens: int | None,
    latency_ms: float | None,
    ttft_ms: float | None = None,
) -> None:
    """Counts one request-log row into `stats` (a success is a 2xx answer)."""
    stats["requests"] += 1
    if 200 <= status < 300:
        stats["ok"] += 1
    elif 400 <= status < 500:
        stats["4xx"] += 1
    elif status >= 500:
        stats["5xx"] += 1
    # Tokens of admitted work only, by routing/cost.py's ADMITTED test: a request refused at the door
    # (scope, quota, limits, context) carries the prompt tokens the proxy counted, but nothing was
    # served for it, and the charts' token rates would otherwise read a flood of refusals as load.
    if status < 400 or completion_tokens is not None:
        stats["prompt_tokens"] += prompt_tokens or 0
        stats["completion_tokens"] += completion_tokens or 0
    for name, ms in (("latency", latency_ms), ("ttft", ttft_ms)):
        if ms is not None:
            key = str(latency_bucket(ms))
            stats[name][key] = stats[name].get(key, 0) + 1


def combine_requests(buckets: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Request values of several buckets as one: counts and histograms summed, part by part."""
    out: dict[str, Any] = {}
    # Written for speed (a 1 h point combines 60 of about 200 numbers each; 220 pools and tenants):
    # no empty dict made per missing part or histogram, the histogram's get looked up once.
    for values in buckets:
        for part, stats in values.items():
            merged = out.get(part)
            if merged is None:
                merged = out[part] = empty_requests()
            for name in REQUEST_COUNTS:
                count = stats.get(name)
                if count:
                    merged[name] += int(count)
            for name in REQUEST_HISTOGRAMS:
                counts = stats.get(name)
                if counts:
                    histogram = merged[name]
                    get = histogram.get
                    for key, count in counts.items():
                        histogram[key] = get(key, 0) + int(count)
    return out


def gauge_point(values: Sequence[float | None]) -> list[float | None]:
    """One sample's gauge point: `[1, value, ...]`."""
    return [1, *values]


# Significant digits a coarser gauge point keeps: a mean of samples (45.333333333333336) has no use for
# sixteen of them in a chart, and the 1 min and 1 h points are most of the history on disk.
SIGNIFICANT = 4


def significant(point: Sequence[float | None]) -> list[float | None]:
    """A gauge point with its means rounded to SIGNIFICANT digits (`n`, first, is left as it is)."""
    out: list[float | None] = list(point[:1])
    for value in point[1:]:
        if value is None or value == 0 or not math.isfinite(value):
            out.append(value)
        else:
            out.append(round(value, SIGNIFICANT - 1 - math.floor(math.log10(abs(value)))))
    return out


def encode_gauges(point: Sequence[float | None]) -> str:
    """A coarser gauge point as kept: `"n,mean,..."`, SIGNIFICANT digits, empty where null.

    A string of short numbers takes about half the bytes of the JSON list it stands for (jsonb keeps
    each number as a 4-byte entry and an aligned numeric of 8 or more), and the 10 s points, written
    by every tick, stay lists: formatting 83,000 numbers a tick would cost more than the tick.
    """
    return ",".join("" if v is None else f"{v:g}" for v in significant(point))


def gauge_list(point: Sequence[float | None] | str) -> list[float | None]:
    """A gauge point as a list, whether kept as one (10 s) or as `encode_gauges` text (1 min, 1 h)."""
    if isinstance(point, str):
        return [float(v) if v else None for v in point.split(",")]
    return list(point)


def combine_gauges(buckets: Iterable[Sequence[float | None] | str]) -> list[float | None]:
    """Gauge points of several buckets as one: each field's mean over all the samples behind them."""
    sums: list[float] = []
    weights: list[int] = []
    total = 0
    for kept in buckets:
        point = gauge_list(kept)
        n = int(point[0] or 0) if point else 0
        total += n
        for i, value in enumerate(point[1:]):
            if i >= len(sums):
                sums.append(0.0)
                weights.append(0)
            if value is not None:
                sums[i] += float(value) * n
                weights[i] += n
    return [total, *(sums[i] / weights[i] if weights[i] else None for i in range(len(sums)))]


def request_series_point(stats: Mapping[str, Any] | None, seconds: float) -> dict[str, float | None]:
    """One chart point of request stats over a bucket of `seconds`: rates, success rate, percentiles.

    No stats (no row: no requests in the bucket) reads as zero requests and no rate or latency.
    """
    if not stats or not stats.get("requests"):
        return {
            "requests_per_s": 0.0,
            "success_rate": None,
            "latency_p50_ms": None,
            "latency_p95_ms": None,
            "prompt_tokens_per_s": 0.0,
            "completion_tokens_per_s": 0.0,
        }
    requests = int(stats["requests"])
    return {
        "requests_per_s": requests / seconds,
        "success_rate": int(stats["ok"]) / requests,
        "latency_p50_ms": percentile(stats.get("latency", {}), 0.5),
        "latency_p95_ms": percentile(stats.get("latency", {}), 0.95),
        "prompt_tokens_per_s": int(stats["prompt_tokens"]) / seconds,
        "completion_tokens_per_s": int(stats["completion_tokens"]) / seconds,
    }
