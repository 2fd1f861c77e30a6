"""The last hour of GPU and engine samples, kept in Redis for the console's charts.

Each series (one GPU, one deployment) is a Redis stream that the agent appends to at every telemetry
tick (1 Hz by default) in the same pipeline as the live values. Entry IDs are Redis's own clock
(milliseconds), so entries older than NODE_HISTORY_SECONDS are trimmed as new ones arrive (XADD
MINID) and a time window is an XRANGE by ID. A series no longer written
(a GPU gone, a deployment stopped) expires as a whole after the same time, so memory stays bounded:
about 3,600 short entries per series.

Readers get columns (`t` plus one list per metric), the shape a time-series chart takes as is.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings
from redis.typing import EncodableT, FieldT

from core.redis_client import get_redis, key

# What is kept of each sample: the charted numbers only, not the live record's identity fields.
GPU_FIELDS = ("utilization_pct", "memory_used_bytes", "temperature_c", "power_watts")
ENGINE_FIELDS = (
    "tokens_per_s",
    "kv_cache_usage_perc",
    "num_requests_running",
    "num_requests_waiting",
    "ttft_p50_s",
    "itl_p50_s",
)
# A reader asking for more points than this gets bucket means instead: an hour at a faster tick
# than 1 Hz still draws as ~3,600 points.
MAX_POINTS = 3600


def gpu_series_key(host_name: str, index: int) -> str:
    return key("history", "gpu", host_name, str(index))


def engine_series_key(deployment_id: int) -> str:
    return key("history", "deployment", str(deployment_id))


def history_seconds() -> float:
    return settings.NODE_HISTORY_SECONDS


def encode(sample: dict[str, Any], fields: Sequence[str]) -> dict[FieldT, EncodableT]:
    """A sample as stream fields: the time and each kept field, an absent value as an empty string."""
    out: dict[FieldT, EncodableT] = {"ts": repr(float(sample["ts"]))}
    for name in fields:
        value = sample.get(name)
        # An absent value (no power reading, no TTFT yet) is kept as a gap, not as zero.
        out[name] = "" if value is None else repr(float(value))
    return out


def _append(pipe: Any, redis_key: str, fields: dict[FieldT, EncodableT], min_id_ms: int, keep_s: int) -> None:
    # Exact trimming: at one entry per tick it drops about one old entry per append.
    pipe.xadd(redis_key, fields, minid=min_id_ms, approximate=False)
    pipe.expire(redis_key, keep_s)


def record(
    pipe: Any, host_name: str, gpus: Iterable[dict[str, Any]], engines: Iterable[dict[str, Any]]
) -> None:
    """Queue one tick's GPU samples and engine live records on `pipe` (the caller executes it)."""
    keep = history_seconds()
    min_id_ms = int((time.time() - keep) * 1000)
    keep_s = max(1, math.ceil(keep))
    for sample in gpus:
        _append(
            pipe,
            gpu_series_key(host_name, int(sample["index"])),
            encode(sample, GPU_FIELDS),
            min_id_ms,
            keep_s,
        )
    for live in engines:
        _append(
            pipe,
            engine_series_key(int(live["deployment_id"])),
            encode(live, ENGINE_FIELDS),
            min_id_ms,
            keep_s,
        )


@dataclass
class Series:
    """Columns of one series: `t` (unix seconds) and one list per field, None where a value was absent."""

    t: list[float]
    values: dict[str, list[float | None]]


def _decode(entries: list[tuple[Any, dict[Any, Any]]], fields: Sequence[str]) -> Series:
    series = Series(t=[], values={name: [] for name in fields})
    for _entry_id, raw in entries:
        data = {_text(k): _text(v) for k, v in raw.items()}
        try:
            ts = float(data["ts"])
        except (KeyError, ValueError):
            continue
        series.t.append(ts)
        for name in fields:
            text = data.get(name, "")
            try:
                series.values[name].append(float(text) if text else None)
            except ValueError:
                series.values[name].append(None)
    return downsample(series, MAX_POINTS)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def downsample(series: Series, max_points: int) -> Series:
    """Bucket means (gaps ignored) when a series has more than `max_points` points."""
    n = len(series.t)
    if n <= max_points:
        return series
    size = math.ceil(n / max_points)
    out = Series(t=[], values={name: [] for name in series.values})
    for start in range(0, n, size):
        stop = min(n, start + size)
        out.t.append(series.t[stop - 1])
        for name, column in series.values.items():
            present = [v for v in column[start:stop] if v is not None]
            out.values[name].append(sum(present) / len(present) if present else None)
    return out


def read(
    gpus: Sequence[tuple[str, int]], deployments: Sequence[int], minutes: float
) -> tuple[dict[tuple[str, int], Series], dict[int, Series]]:
    """The last `minutes` of the given GPU series ((host, index) pairs) and deployment series.

    One round trip for all of them; a series with no samples (or Redis down) comes back empty.
    """
    since_ms = int((time.time() - minutes * 60) * 1000)
    keys = [gpu_series_key(h, i) for h, i in gpus] + [engine_series_key(d) for d in deployments]
    results: list[Any] = []
    if keys:
        try:
            pipe = get_redis().pipeline(transaction=False)
            for redis_key in keys:
                pipe.xrange(redis_key, min=str(since_ms), max="+")
            results = pipe.execute()
        except redis.RedisError:
            results = []
    if len(results) != len(keys):
        results = [[] for _ in keys]
    gpu_out = {gpu: _decode(results[i], GPU_FIELDS) for i, gpu in enumerate(gpus)}
    offset = len(gpus)
    engine_out = {d: _decode(results[offset + i], ENGINE_FIELDS) for i, d in enumerate(deployments)}
    return gpu_out, engine_out
