"""A host's 10 s history point, written by the agent sync beside its live records.

The charts' history (routing/rollups/) keeps one row per host and 10 s bucket for its GPUs and one for
its engines. Built by the rollup tick from the live records, that cost the tick an MGET and a parse of
every GPU's and engine's record (13,000 at 1,000 hosts: most of its 175 ms, docs/benchmarks.md).
Instead, each sync's telemetry script (nodes/agent_telemetry.py) also sets the host's field in the hash
of the current bucket to the two rows' values, already encoded: the tick reads one hash of 1,000
fields and hands the text to COPY as it is. The last sync in a bucket wins, so a point is the host's
latest sample of that bucket, as the live record at the tick was before.

A host whose live records are written otherwise (the in-process supervisor of a single-machine
install, tests) has no field in the hash; the tick reads its live records as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from core.redis_client import key

BUCKET_SECONDS = 10
# The hash of a bucket is read by the tick of the next bucket; kept long enough for a late tick.
KEEP_SECONDS = 6 * BUCKET_SECONDS
# What a point keeps of a GPU's sample and an engine's live record, in this order (routing/rollups/
# stats.py: `[n, mean, ...]`). A field added later goes at the end.
GPU_FIELDS = ("utilization_pct", "memory_used_bytes", "memory_total_bytes", "temperature_c", "power_watts")
ENGINE_FIELDS = (
    "num_requests_running",
    "num_requests_waiting",
    "kv_cache_usage_perc",
    "tokens_per_s",
    "ttft_p95_s",
    "itl_p95_s",
)
# Separates the GPU row's values from the engine row's in a hash field: orjson never writes a raw
# newline, so the tick splits without parsing.
SEPARATOR = b"\n"


def bucket_of(ts: float) -> int:
    return int(ts // BUCKET_SECONDS) * BUCKET_SECONDS


def bucket_key(bucket: int) -> str:
    return key("rollup", "points", str(bucket))


def gauges(record: dict[str, Any], fields: Iterable[str]) -> list[float | None]:
    """One sample as a point: `[1, value, ...]`, null where the record has no number."""
    # Written on every agent sync (and for 13,000 records a tick where the rollup builds them), so a
    # plain loop: half the time of a generator over map(). type() and not isinstance(): a bool is an
    # int, and never a gauge.
    out: list[float | None] = [1]
    for name in fields:
        value = record.get(name)
        kind = type(value)
        out.append(float(value) if kind is float or kind is int else None)  # type: ignore[arg-type]
    return out


def host_point(gpus: Iterable[dict[str, Any]], engines: Iterable[dict[str, Any]]) -> bytes:
    """The hash field's value: the GPU row's values (`{"<index>": point}`), SEPARATOR, the engine row's
    (`{"<deployment id>": point}`)."""
    gpu_row = {str(s["index"]): gauges(s, GPU_FIELDS) for s in gpus}
    engine_row = {str(e["deployment_id"]): gauges(e, ENGINE_FIELDS) for e in engines}
    return orjson.dumps(gpu_row) + SEPARATOR + orjson.dumps(engine_row)
