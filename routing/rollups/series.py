"""Reading the charts' history: a time range's series of some subjects, at the resolution that fits.

A range is drawn at the finest resolution that still keeps it and gives at most MAX_POINTS points
(15 min and 1 h at 10 s, 24 h at 1 min, 30 days at 1 h). All subjects share one time grid (bucket
starts), the shape a uPlot chart takes as is; a bucket without a point is null, except for request
series, where no row means no requests (zero), up to the newest request point written.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from typing import Any

from django.db.models import Q

from console.models import Tenant
from models_registry.models import ModelAlias
from nodes.models import Deployment, Gpu
from routing.choices import RollupKind
from routing.models import MetricRollup, RoutePool
from routing.rollups import stats
from routing.rollups.services import (
    ENGINE_FIELDS,
    GPU_FIELDS,
    PACKED_KINDS,
    REQUEST_KINDS,
    RESOLUTIONS,
    bucket_start,
    keep_seconds,
    newest_request_bucket,
    packed_row,
)

RANGES = {
    "15m": 900,
    "1h": 3600,
    "6h": 6 * 3600,
    "24h": 86400,
    "7d": 7 * 86400,
    "30d": 30 * 86400,
    "90d": 90 * 86400,
}
MAX_POINTS = 1500
MAX_SUBJECTS = 64
REQUEST_FIELDS = tuple(stats.request_series_point(None, 1.0))
POOL_PARTS = ("all", "short", "long")

# The unit of each series, for the axes.
UNITS: dict[str, str] = {
    "utilization_pct": "%",
    "memory_used_bytes": "bytes",
    "memory_total_bytes": "bytes",
    "temperature_c": "°C",
    "power_watts": "W",
    "num_requests_running": "requests",
    "num_requests_waiting": "requests",
    "kv_cache_usage_perc": "ratio",
    "tokens_per_s": "tokens/s",
    "ttft_p95_s": "s",
    "itl_p95_s": "s",
    "requests_per_s": "requests/s",
    "success_rate": "ratio",
    "latency_p50_ms": "ms",
    "latency_p95_ms": "ms",
    "prompt_tokens_per_s": "tokens/s",
    "completion_tokens_per_s": "tokens/s",
}
SUBJECT_HELP = "Use gpu:<host>:<index>, engine:<deployment id>, pool:<pool name> or tenant:<tenant id>."


def pick_resolution(span_s: float, age_s: float | None = None) -> int:
    """The finest resolution that still keeps a range starting `age_s` ago (default: a range ending
    now, `span_s` long) and draws it in at most MAX_POINTS points. A past hour of yesterday is drawn
    from 1 min points once its 10 s points are past retention, rather than as an empty chart."""
    age = span_s if age_s is None else age_s
    for resolution in RESOLUTIONS:
        if age <= keep_seconds(resolution) and span_s / resolution <= MAX_POINTS:
            return resolution
    return RESOLUTIONS[-1]


@dataclass(frozen=True)
class Subject:
    kind: str
    key: str  # the name's key: `<host>:<index>`, a deployment id, a pool name, a tenant id
    label: str
    host: str = ""  # an engine's host, whose row keeps its points (services.packed_row)

    @property
    def row(self) -> tuple[str, str | None]:
        """(MetricRollup.subject, the member of its values) where this subject's points are kept."""
        if self.kind in PACKED_KINDS:
            return packed_row(self.kind, self.key, self.host)
        return self.key, None

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.key}"


def parse_subject(text: str) -> Subject:
    """A subject from its `kind:key` name, checked against the inventory; ValueError says what is wrong."""
    kind, _, rest = text.partition(":")
    if kind == RollupKind.GPU:
        host, sep, index = rest.rpartition(":")
        if not sep or not host or not index.isdigit():
            raise ValueError(f"'{text}': a GPU is gpu:<host>:<index>, e.g. gpu:demo-a:0.")
        if not Gpu.objects.filter(host__name=host, index=int(index)).exists():
            raise ValueError(f"'{text}': host {host} has no GPU {index}.")
        return Subject(RollupKind.GPU, f"{host}:{int(index)}", f"{host} GPU {int(index)}")
    if kind == RollupKind.ENGINE:
        if not rest.isdigit():
            raise ValueError(f"'{text}': an engine is engine:<deployment id>, e.g. engine:3.")
        found = Deployment.objects.filter(pk=int(rest)).values_list("name", "host__name").first()
        if found is None:
            raise ValueError(f"'{text}': no deployment with id {rest}.")
        return Subject(RollupKind.ENGINE, str(int(rest)), found[0], host=found[1])
    if kind == RollupKind.POOL:
        # A pool is a RoutePool, or an alias without a policy, which the proxy routes as a pool of its own
        # name (routing/proxy/app.py); a pool since removed still has its history.
        known = (
            RoutePool.objects.filter(name=rest).exists()
            or ModelAlias.objects.filter(name=rest).exists()
            or MetricRollup.objects.filter(kind=RollupKind.POOL, subject=rest).exists()
        )
        if not rest or not known:
            raise ValueError(f"'{text}': no route pool named '{rest}' (and no history of one).")
        return Subject(RollupKind.POOL, rest, rest)
    if kind == RollupKind.TENANT:
        if not rest.isdigit():
            raise ValueError(f"'{text}': a tenant is tenant:<tenant id>, e.g. tenant:2.")
        name = Tenant.objects.filter(pk=int(rest)).values_list("name", flat=True).first()
        if name is None:
            raise ValueError(f"'{text}': no tenant with id {rest}.")
        return Subject(RollupKind.TENANT, str(int(rest)), name)
    raise ValueError(f"'{text}': unknown kind '{kind}'. {SUBJECT_HELP}")


def _fields(kind: str) -> list[str]:
    if kind == RollupKind.GPU:
        return list(GPU_FIELDS)
    if kind == RollupKind.ENGINE:
        return list(ENGINE_FIELDS)
    if kind == RollupKind.POOL:
        return [f if part == "all" else f"{part}_{f}" for part in POOL_PARTS for f in REQUEST_FIELDS]
    return list(REQUEST_FIELDS)


def read(subjects: list[Subject], range_key: str, end: dt.datetime) -> dict[str, Any]:
    """The series of `subjects` over the range ending at `end`, as columns on one time grid."""
    span = RANGES[range_key]
    resolution = pick_resolution(span, time.time() - end.timestamp() + span)
    last = bucket_start(end.timestamp(), resolution)
    first = last - span + resolution
    grid = [first + i * resolution for i in range(int(span // resolution))]
    index = {t: i for i, t in enumerate(grid)}
    at = {t: dt.datetime.fromtimestamp(t, dt.UTC) for t in (first, last)}
    points: dict[tuple[str, str], dict[float, Any]] = {}
    if subjects:
        by_kind: dict[str, set[str]] = {}
        for s in subjects:
            by_kind.setdefault(s.kind, set()).add(s.row[0])
        which = Q()
        for kind, rows_of_kind in by_kind.items():
            which |= Q(kind=kind, subject__in=sorted(rows_of_kind))
        query = MetricRollup.objects.filter(
            which, resolution_s=resolution, bucket__gte=at[first], bucket__lte=at[last]
        ).values_list("kind", "subject", "bucket", "values")
        for kind, subject, bucket, values in query:
            points.setdefault((kind, subject), {})[bucket.timestamp()] = values
    newest_requests = (
        newest_request_bucket(resolution) if any(s.kind in REQUEST_KINDS for s in subjects) else None
    )
    series = []
    for s in subjects:
        row, member = s.row
        rows = points.get((s.kind, row), {})
        if member is not None:  # a GPU's or engine's points inside its host's rows
            rows = {
                t: packed[member]
                for t, packed in rows.items()
                if isinstance(packed, dict) and member in packed
            }
        fields = _fields(s.kind)
        columns: dict[str, list[float | None]] = {f: [None] * len(grid) for f in fields}
        if s.kind in REQUEST_KINDS:
            for t in grid:
                if newest_requests is None or t > newest_requests:
                    continue
                values = rows.get(t, {})
                parts = POOL_PARTS if s.kind == RollupKind.POOL else ("all",)
                for part in parts:
                    point = stats.request_series_point(values.get(part), resolution)
                    for f, v in point.items():
                        columns[f if part == "all" else f"{part}_{f}"][index[t]] = v
        else:
            for t, point in rows.items():
                i = index.get(t)
                if i is not None:
                    for f, v in zip(fields, stats.gauge_list(point)[1:], strict=False):
                        columns[f][i] = None if v is None else float(v)
        in_range = [v for t, v in rows.items() if t in index]
        series.append(
            {
                "subject": s.name,
                "kind": s.kind,
                "name": s.label,
                "values": columns,
                "summary": _summary(s.kind, in_range, span),
            }
        )
    return {
        "range": range_key,
        "resolution_s": resolution,
        "start": first,
        "end": last + resolution,
        "t": grid,
        "units": {f: UNITS[_base(f)] for s in subjects for f in _fields(s.kind)},
        "series": series,
    }


def _summary(kind: str, rows: list[Any], span: float) -> dict[str, float | None]:
    """The whole range as one point: gauge means over its samples, or request figures over all its
    requests (rates over the range; success rate and percentiles of every request in it)."""
    if kind not in REQUEST_KINDS:
        means = stats.combine_gauges(rows)[1:]
        return {f: (means[i] if i < len(means) else None) for i, f in enumerate(_fields(kind))}
    total = stats.combine_requests(rows)
    out: dict[str, float | None] = {}
    for part in POOL_PARTS if kind == RollupKind.POOL else ("all",):
        for f, v in stats.request_series_point(total.get(part), span).items():
            out[f if part == "all" else f"{part}_{f}"] = v
    return out


def _base(field: str) -> str:
    """`short_success_rate` -> `success_rate`: a pool's breakdown has the units of its totals."""
    part, _, rest = field.partition("_")
    return rest if part in POOL_PARTS else field
