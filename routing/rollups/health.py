"""The fleet's and each pool's request health over a window: rate, errors by status class, latency and
TTFT percentiles, the RED figures the dashboard shows before anything else.

Read from the pools' request points (routing/rollups, written by beat from the request log), never from
the request log itself: a window is at most 1,440 points a pool (24 h at 1 min; 5 min to 1 h at 10 s),
one indexed range read of the rollup table whatever the request log's size, and only each point's `all`
part leaves PostgreSQL. The fleet is the sum of its pools, so requests refused before a pool was chosen
(a bad key, an unknown model, a malformed body) are not in it: the tenant's history and the proxy's
per-tenant metrics count those. Percentiles come from the merged histograms (within 19%, one bucket),
never a mean of percentiles; the numbers lag the proxy by the rollup's 20 s (services.REQUEST_LAG_SECONDS).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from django.db.models import Max
from django.db.models.fields.json import KeyTransform

from routing.choices import RollupKind
from routing.models import MetricRollup, RoutePool
from routing.rollups import stats
from routing.rollups.series import pick_resolution
from routing.rollups.services import REQUEST_LAG_SECONDS, SETTLE_SECONDS, TICK_SECONDS, bucket_start

WINDOWS = {"5m": 300, "15m": 900, "1h": 3600, "6h": 6 * 3600, "24h": 86400}
DEFAULT_WINDOW = "1h"
FIELDS = (
    "requests_per_s",
    "error_rate",
    "error_rate_4xx",
    "error_rate_5xx",
    "latency_p50_ms",
    "latency_p99_ms",
    "ttft_p50_ms",
    "ttft_p99_ms",
)
# How long after a bucket ends its request point is surely written, when beat runs: a 10 s point by the
# tick REQUEST_LAG_SECONDS later (plus a tick), a 1 min point by the aggregation run after it settles
# (every 60 s). A bucket past this with no row had no requests; one before it may be unwritten. No 1 h
# entry: the windows end at 24 h (1 min points), and an hour's points come a slice at a time
# (services.newest_request_bucket knows when they are all in).
WRITTEN_AFTER = {10: REQUEST_LAG_SECONDS + TICK_SECONDS, 60: SETTLE_SECONDS + 60}


def health_figures(total: Mapping[str, Any] | None, seconds: float) -> dict[str, Any]:
    """One set of request stats over `seconds` as the health figures: counts, rate, error shares of all
    requests (4xx and 5xx apart), p50 and p99 latency and TTFT; null rates and percentiles without data."""
    requests = int((total or {}).get("requests", 0))
    ok = int((total or {}).get("ok", 0))
    client = int((total or {}).get("4xx", 0))
    server = int((total or {}).get("5xx", 0))
    latency = (total or {}).get("latency", {})
    ttft = (total or {}).get("ttft", {})
    return {
        "requests": requests,
        "errors_4xx": client,
        "errors_5xx": server,
        "requests_per_s": requests / seconds if seconds > 0 else 0.0,
        "error_rate": (requests - ok) / requests if requests else None,
        "error_rate_4xx": client / requests if requests else None,
        "error_rate_5xx": server / requests if requests else None,
        "latency_p50_ms": stats.percentile(latency, 0.5),
        "latency_p99_ms": stats.percentile(latency, 0.99),
        "ttft_p50_ms": stats.percentile(ttft, 0.5),
        "ttft_p99_ms": stats.percentile(ttft, 0.99),
    }


def read_health(window: str, now: dt.datetime) -> dict[str, Any]:
    """The fleet's and every pool's health figures over the `window` (a key of WINDOWS) ending at `now`,
    and the fleet's figures per point of the window's grid (null past the newest point written)."""
    span = WINDOWS[window]
    resolution = pick_resolution(span)
    last = bucket_start(now.timestamp(), resolution)
    first = last - span + resolution
    grid = [first + i * resolution for i in range(int(span // resolution))]
    at_first = dt.datetime.fromtimestamp(first, dt.UTC)
    at_last = dt.datetime.fromtimestamp(last, dt.UTC)
    rows = MetricRollup.objects.filter(
        kind=RollupKind.POOL, resolution_s=resolution, bucket__gte=at_first, bucket__lte=at_last
    ).values_list("subject", "bucket", KeyTransform("all", "values"))
    by_bucket: dict[float, list[Any]] = {}
    by_pool: dict[str, list[Any]] = {}
    for pool, bucket, whole in rows.iterator(chunk_size=5000):
        if not isinstance(whole, dict):
            continue
        by_bucket.setdefault(bucket.timestamp(), []).append({"all": whole})
        by_pool.setdefault(pool, []).append({"all": whole})
    # A bucket is known once a later point was written or its rollup is surely done; the newest ones
    # (the rollup lags the proxy) are unknown, not zero, and are left out of the window's figures.
    settled = now.timestamp() - WRITTEN_AFTER[resolution] - resolution
    newest = max(_newest_point(resolution, at_last) or settled, settled)
    covered = sum(resolution for t in grid if t <= newest)
    series: dict[str, list[float | None]] = {f: [None] * len(grid) for f in FIELDS}
    for i, t in enumerate(grid):
        if t > newest:
            continue
        point = health_figures(stats.combine_requests(by_bucket.get(t, [])).get("all"), resolution)
        for f in FIELDS:
            series[f][i] = point[f]
    fleet_total = stats.combine_requests(v for values in by_pool.values() for v in values).get("all")
    configured = set(RoutePool.objects.values_list("name", flat=True))
    pools = [
        {"name": name, **health_figures(stats.combine_requests(by_pool.get(name, [])).get("all"), covered)}
        for name in configured | set(by_pool)
    ]
    pools.sort(key=lambda p: (-p["requests"], p["name"]))
    return {
        "window": window,
        "resolution_s": resolution,
        "start": first,
        "end": last + resolution,
        "known_until": min(bucket_start(newest, resolution), last) + resolution,
        "t": grid,
        "fleet": health_figures(fleet_total, covered),
        "series": series,
        "pools": pools,
    }


def _newest_point(resolution: int, at_most: dt.datetime) -> float | None:
    """Start of the newest request point written at `resolution` (pools' or tenants'), up to `at_most`:
    the buckets after it are not rolled up yet."""
    newest = MetricRollup.objects.filter(
        resolution_s=resolution,
        kind__in=(RollupKind.POOL, RollupKind.TENANT),
        bucket__lte=at_most,
        bucket__gte=at_most - dt.timedelta(days=1),
    ).aggregate(newest=Max("bucket"))["newest"]
    return None if newest is None else newest.timestamp()
