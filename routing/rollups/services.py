"""Writing the charts' history: 10 s points each beat tick, 1 min and 1 h aggregates, pruning.

Every write is one bulk INSERT for the whole fleet (whatever its size): a tick's 10 s points (every
GPU's and engine's live record, read with one MGET as the fleet exposition does, and the request log's
rows of one bucket grouped by pool and tenant), and each aggregation run's coarser points. Inserts skip
rows already there (the unique bucket of a subject), so a tick or an aggregation run twice writes
nothing twice.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db.models import Q

from nodes.choices import DeploymentState, DesiredState
from nodes.lifecycle import live_deployment_key, live_gpu_key, read_live_many
from nodes.models import Deployment, Gpu
from routing.choices import RollupKind
from routing.models import MetricRollup, RequestLog
from routing.rollups import stats

TICK_SECONDS = 10
RESOLUTIONS = (10, 60, 3600)
GPU_FIELDS = ("utilization_pct", "memory_used_bytes", "memory_total_bytes", "temperature_c", "power_watts")
ENGINE_FIELDS = (
    "num_requests_running",
    "num_requests_waiting",
    "kv_cache_usage_perc",
    "tokens_per_s",
    "ttft_p95_s",
    "itl_p95_s",
)
GAUGE_FIELDS: dict[str, tuple[str, ...]] = {RollupKind.GPU: GPU_FIELDS, RollupKind.ENGINE: ENGINE_FIELDS}
# The request log is written by the proxy in batches (every 0.5 s, later after a database outage), so a
# tick rolls up the request bucket that ended one whole bucket ago, not the one that just ended.
REQUEST_LAG_SECONDS = 2 * TICK_SECONDS
REQUEST_KINDS = (RollupKind.POOL, RollupKind.TENANT)
# A coarser bucket is aggregated once every finer point of it can have been written (request rows
# arrive REQUEST_LAG_SECONDS late), and missed buckets are caught up this far back.
SETTLE_SECONDS = REQUEST_LAG_SECONDS + TICK_SECONDS
LOOKBACK_BUCKETS = {60: 15, 3600: 3}
FINER = {60: 10, 3600: 60}


def bucket_start(ts: float, resolution: int) -> float:
    return float(int(ts // resolution) * resolution)


def _at(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, dt.UTC)


def keep_seconds(resolution: int) -> float:
    """How long a resolution's points are kept (settings HISTORY_KEEP_*)."""
    return {
        10: settings.HISTORY_KEEP_10S_HOURS * 3600.0,
        60: settings.HISTORY_KEEP_1MIN_DAYS * 86400.0,
        3600: settings.HISTORY_KEEP_1H_DAYS * 86400.0,
    }[resolution]


def gpu_subject(host: str, index: int) -> str:
    return f"{host}:{index}"


def _gauges(live: dict[str, Any], fields: Iterable[str]) -> list[float | None]:
    values: list[float | None] = []
    for name in fields:
        value = live.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            values.append(float(value))
        else:
            values.append(None)
    return stats.gauge_point(values)


def gauge_values(kind: str, n: int = 1, **fields: float) -> list[float | None]:
    """A gauge point of `kind` from named fields (absent ones null): `[n, value, ...]`."""
    return [n, *(fields.get(name) for name in GAUGE_FIELDS[kind])]


def named_gauges(kind: str, point: list[Any]) -> dict[str, Any]:
    """A gauge point's fields by name, `n` first, absent (null) ones left out: for people and tests."""
    out: dict[str, Any] = {"n": point[0]}
    out.update({f: v for f, v in zip(GAUGE_FIELDS[kind], point[1:], strict=False) if v is not None})
    return out


def collect_live(now: float) -> list[MetricRollup]:
    """The 10 s points of every GPU and engine with a current live record (one MGET)."""
    at = _at(bucket_start(now, TICK_SECONDS))
    gpus = list(Gpu.objects.order_by("host__name", "index").values_list("host__name", "index"))
    deployments = list(
        Deployment.objects.exclude(state=DeploymentState.STOPPED, desired_state=DesiredState.STOPPED)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    gpu_keys = [live_gpu_key(h, i) for h, i in gpus]
    engine_keys = [live_deployment_key(pk) for pk in deployments]
    # One MGET; with Redis down there are no live records, so no points (a gap in the charts).
    live = read_live_many(gpu_keys + engine_keys)
    rows: list[MetricRollup] = []
    for (host, index), key in zip(gpus, gpu_keys, strict=True):
        if key in live:
            rows.append(
                _row(10, RollupKind.GPU, gpu_subject(host, index), at, _gauges(live[key], GPU_FIELDS))
            )
    for pk, key in zip(deployments, engine_keys, strict=True):
        if key in live:
            rows.append(_row(10, RollupKind.ENGINE, str(pk), at, _gauges(live[key], ENGINE_FIELDS)))
    return rows


def collect_requests(now: float) -> list[MetricRollup]:
    """The 10 s request points per pool (all, short, long prompts) and per tenant, of the bucket that
    ended REQUEST_LAG_SECONDS - TICK_SECONDS ago."""
    start = bucket_start(now, TICK_SECONDS) - REQUEST_LAG_SECONDS
    at = _at(start)
    long_from = settings.PROXY_LONG_PROMPT_TOKENS
    pools: dict[str, dict[str, Any]] = {}
    tenants: dict[str, dict[str, Any]] = {}
    rows = RequestLog.objects.filter(
        created_at__gte=at, created_at__lt=_at(start + TICK_SECONDS)
    ).values_list("route_pool", "tenant_id", "status", "prompt_tokens", "completion_tokens", "latency_ms")
    for pool, tenant_id, status, prompt, completion, latency in rows.iterator(chunk_size=5000):
        if pool:
            parts = pools.setdefault(pool, {"all": stats.empty_requests()})
            length = "long" if (prompt or 0) >= long_from else "short"
            for part in ("all", length):
                stats.add_request(
                    parts.setdefault(part, stats.empty_requests()), status, prompt, completion, latency
                )
        if tenant_id is not None:
            parts = tenants.setdefault(str(tenant_id), {"all": stats.empty_requests()})
            stats.add_request(parts["all"], status, prompt, completion, latency)
    return [_row(10, RollupKind.POOL, name, at, values) for name, values in pools.items()] + [
        _row(10, RollupKind.TENANT, tid, at, values) for tid, values in tenants.items()
    ]


def _row(resolution: int, kind: str, subject: str, at: dt.datetime, values: Any) -> MetricRollup:
    return MetricRollup(resolution_s=resolution, kind=kind, subject=subject, bucket=at, values=values)


def _insert(rows: list[MetricRollup]) -> int:
    if rows:
        # One INSERT for all rows (PostgreSQL takes any batch size); a bucket already written is skipped.
        MetricRollup.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)


def rollup_tick(now: float | None = None) -> int:
    """One beat tick: the 10 s points of GPUs, engines, pools and tenants, in one insert. Rows offered."""
    now = time.time() if now is None else now
    return _insert(collect_live(now) + collect_requests(now))


@dataclass
class Aggregated:
    resolution_s: int
    buckets: int
    rows: int


def aggregate(resolution: int, now: float | None = None) -> Aggregated:
    """Writes the coarser points (`resolution` 60 or 3600) of every settled bucket not yet written,
    from the finer points: one read of the finer rows and one insert for all of them."""
    now = time.time() if now is None else now
    finer = FINER[resolution]
    last = bucket_start(now - SETTLE_SECONDS, resolution) - resolution
    candidates = [last - k * resolution for k in range(LOOKBACK_BUCKETS[resolution])]
    oldest = candidates[-1]
    done = {
        b.timestamp()
        for b in MetricRollup.objects.filter(
            resolution_s=resolution, bucket__gte=_at(oldest), bucket__lte=_at(last)
        )
        .values_list("bucket", flat=True)
        .distinct()
    }
    missing = sorted(b for b in candidates if b not in done)
    if not missing:
        return Aggregated(resolution, 0, 0)
    groups: dict[tuple[str, str, float], list[Any]] = {}
    finer_rows = MetricRollup.objects.filter(
        resolution_s=finer, bucket__gte=_at(missing[0]), bucket__lt=_at(missing[-1] + resolution)
    ).values_list("kind", "subject", "bucket", "values")
    wanted = set(missing)
    for kind, subject, bucket, values in finer_rows.iterator(chunk_size=5000):
        coarse = bucket_start(bucket.timestamp(), resolution)
        if coarse in wanted:
            groups.setdefault((kind, subject, coarse), []).append(values)
    rows = [
        _row(
            resolution,
            kind,
            subject,
            _at(coarse),
            stats.combine_requests(values) if kind in REQUEST_KINDS else stats.combine_gauges(values),
        )
        for (kind, subject, coarse), values in groups.items()
    ]
    written = {coarse for _, _, coarse in groups}
    return Aggregated(resolution, len(written), _insert(rows))


def aggregate_all(now: float | None = None) -> list[Aggregated]:
    """1 min points from 10 s ones, then 1 h points from 1 min ones."""
    now = time.time() if now is None else now
    return [aggregate(60, now), aggregate(3600, now)]


def prune(now: float | None = None) -> dict[int, int]:
    """Deletes each resolution's points older than its retention; rows deleted per resolution."""
    now = time.time() if now is None else now
    deleted: dict[int, int] = {}
    for resolution in RESOLUTIONS:
        cutoff = _at(now - keep_seconds(resolution))
        deleted[resolution], _ = MetricRollup.objects.filter(
            Q(resolution_s=resolution) & Q(bucket__lt=cutoff)
        ).delete()
    return deleted
