"""Writing the charts' history: 10 s points each beat tick, 1 min and 1 h aggregates, pruning.

Every write is one bulk INSERT for the whole fleet (whatever its size): a tick's 10 s points (each
host's GPU and engine rows as its agent's syncs wrote them, nodes/tick_points.py, or from its live
records for a host with none; and the request log's rows of one bucket grouped by pool and tenant), and
each aggregation run's coarser points. Inserts skip
rows already there (the unique bucket of a subject), so a tick or an aggregation run twice writes
nothing twice.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from typing import Any

import orjson
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Max, Min, Q, TextField
from django.db.models.functions import Cast

from core.redis_client import get_redis
from nodes import tick_points
from nodes.choices import DeploymentState, DesiredState
from nodes.lifecycle import live_deployment_key, live_gpu_key, read_live_many
from nodes.models import Deployment, Gpu, Host
from routing.choices import RollupKind
from routing.models import HistoryProgress, MetricRollup, RequestLog
from routing.rollups import partitions, stats
from routing.rollups.stats import SIGNIFICANT

TICK_SECONDS = tick_points.BUCKET_SECONDS
RESOLUTIONS = (10, 60, 3600)
GPU_FIELDS = tick_points.GPU_FIELDS
ENGINE_FIELDS = tick_points.ENGINE_FIELDS
GAUGE_FIELDS: dict[str, tuple[str, ...]] = {RollupKind.GPU: GPU_FIELDS, RollupKind.ENGINE: ENGINE_FIELDS}
# Kinds kept one row per host: `values` maps each member (a GPU index, a deployment id) to its point.
PACKED_KINDS = tuple(GAUGE_FIELDS)
TABLE = MetricRollup._meta.db_table
# One point: (resolution_s, kind, subject, bucket, values), a MetricRollup row before it is written.
Point = tuple[int, str, str, dt.datetime, Any]
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


def packed_row(kind: str, key: str, host: str = "") -> tuple[str, str]:
    """Where a GPU's or engine's points are kept: (the row's subject, the member in its values).

    A GPU (`<host>:<index>`) is member `<index>` of its host's `gpu` row; an engine (its deployment id)
    is member `<id>` of its host's `engine` row (`host`: the deployment's host). One row per host and
    bucket instead of one per GPU and engine: a row's fixed cost (tuple header, three index entries,
    about 200 bytes) was most of the history's disk (docs/capacity.md, "History on disk").
    """
    if kind == RollupKind.GPU:
        row_host, _, index = key.rpartition(":")
        return row_host, index
    return host, key


def gauge_values(kind: str, n: int = 1, **fields: float) -> list[float | None]:
    """A gauge point of `kind` from named fields (absent ones null): `[n, value, ...]`."""
    return [n, *(fields.get(name) for name in GAUGE_FIELDS[kind])]


def named_gauges(kind: str, kept: list[Any] | str) -> dict[str, Any]:
    """A gauge point's fields by name, `n` first, absent (null) ones left out: for people and tests."""
    point = stats.gauge_list(kept)
    out: dict[str, Any] = {"n": point[0]}
    out.update({f: v for f, v in zip(GAUGE_FIELDS[kind], point[1:], strict=False) if v is not None})
    return out


def collect_live(now: float) -> list[Point]:
    """The 10 s points of every GPU and engine, one row per host and kind: `{"<GPU index>": point}` and
    `{"<deployment id>": point}` (see PACKED_KINDS).

    A host whose agent syncs wrote its point into the bucket that just ended (nodes/tick_points.py) gets
    that point, at that bucket, as written: one HGETALL for the fleet and no parse. The others (no
    agent sync in that bucket: the in-process supervisor's hosts, an agent that went quiet) get their
    live records as they are now, at the current bucket, read with one MGET."""
    ended = tick_points.bucket_of(now) - TICK_SECONDS
    written = _host_points(ended)
    points: list[Point] = []
    at_ended = _at(ended)
    for host, raw in written.items():
        gpu_text, _, engine_text = raw.partition(tick_points.SEPARATOR)
        if gpu_text != b"{}":
            points.append(_row(10, RollupKind.GPU, host, at_ended, orjson.Fragment(gpu_text)))
        if engine_text and engine_text != b"{}":
            points.append(_row(10, RollupKind.ENGINE, host, at_ended, orjson.Fragment(engine_text)))
    # The hosts left to read from live records, found by name: one query of 1,000 short rows, where
    # excluding 1,000 names from the GPUs and deployments cost 30 ms even when nothing was left.
    missing = [name for name in Host.objects.values_list("name", flat=True) if name not in written]
    return points + (_collect_from_live_records(now, hosts=missing) if missing else [])


def _host_points(bucket: int) -> dict[str, bytes]:
    """The host points written into `bucket`'s hash, by host; none with Redis down (a gap, as below)."""
    try:
        raw = get_redis().hgetall(tick_points.bucket_key(bucket))
    except Exception:  # redis errors must never break the tick: the hosts fall back to live records
        return {}
    return {
        (h.decode() if isinstance(h, bytes) else h): (v if isinstance(v, bytes) else v.encode())
        for h, v in raw.items()
    }


def _collect_from_live_records(now: float, hosts: list[str]) -> list[Point]:
    at = _at(bucket_start(now, TICK_SECONDS))
    gpus = list(Gpu.objects.filter(host__name__in=hosts).values_list("host__name", "index"))
    deployments = list(
        Deployment.objects.exclude(state=DeploymentState.STOPPED, desired_state=DesiredState.STOPPED)
        .filter(host__name__in=hosts)
        .values_list("pk", "host__name")
    )
    gpu_keys = [live_gpu_key(h, i) for h, i in gpus]
    engine_keys = [live_deployment_key(pk) for pk, _ in deployments]
    # One MGET; with Redis down there are no live records, so no points (a gap in the charts).
    live = read_live_many(gpu_keys + engine_keys)
    by_host: dict[str, dict[str, dict[str, Any]]] = {RollupKind.GPU: {}, RollupKind.ENGINE: {}}
    for (host, index), key in zip(gpus, gpu_keys, strict=True):
        record = live.get(key)
        if record is not None:
            by_host[RollupKind.GPU].setdefault(host, {})[str(index)] = tick_points.gauges(record, GPU_FIELDS)
    for (pk, host), key in zip(deployments, engine_keys, strict=True):
        record = live.get(key)
        if record is not None:
            by_host[RollupKind.ENGINE].setdefault(host, {})[str(pk)] = tick_points.gauges(
                record, ENGINE_FIELDS
            )
    return [
        _row(10, kind, host, at, members)
        for kind, hosts in by_host.items()
        for host, members in sorted(hosts.items())
    ]


def collect_requests(now: float) -> list[Point]:
    """The 10 s request points per pool (all, short, long prompts) and per tenant, of the bucket that
    ended REQUEST_LAG_SECONDS - TICK_SECONDS ago."""
    start = bucket_start(now, TICK_SECONDS) - REQUEST_LAG_SECONDS
    at = _at(start)
    long_from = settings.PROXY_LONG_PROMPT_TOKENS
    pools: dict[str, dict[str, Any]] = {}
    tenants: dict[str, dict[str, Any]] = {}
    rows = RequestLog.objects.filter(
        created_at__gte=at, created_at__lt=_at(start + TICK_SECONDS)
    ).values_list(
        "route_pool", "tenant_id", "status", "prompt_tokens", "completion_tokens", "latency_ms", "ttft_ms"
    )
    # Fetched whole, not through iterator(): on PostgreSQL that is a server-side cursor (DECLARE, FETCH),
    # which cost more than the rows of one 10 s bucket take in memory (2,000 rows: a third of the tick).
    for pool, tenant_id, status, prompt, completion, latency, ttft in rows:
        if pool:
            parts = pools.setdefault(pool, {"all": stats.empty_requests()})
            length = "long" if (prompt or 0) >= long_from else "short"
            for part in ("all", length):
                stats.add_request(
                    parts.setdefault(part, stats.empty_requests()), status, prompt, completion, latency, ttft
                )
        if tenant_id is not None:
            parts = tenants.setdefault(str(tenant_id), {"all": stats.empty_requests()})
            stats.add_request(parts["all"], status, prompt, completion, latency, ttft)
    return [_row(10, RollupKind.POOL, name, at, values) for name, values in pools.items()] + [
        _row(10, RollupKind.TENANT, tid, at, values) for tid, values in tenants.items()
    ]


def _row(resolution: int, kind: str, subject: str, at: dt.datetime, values: Any) -> Point:
    return (resolution, kind, subject, at, values)


def _copy_field(text: str) -> str:
    """A value in COPY's text format: backslash, tab and line breaks escaped (JSON escapes its own
    control characters as backslash sequences, so only its backslashes usually need it)."""
    if "\\" in text or "\t" in text or "\n" in text or "\r" in text:
        text = text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return text


def _copy_text(points: list[Point]) -> str:
    """The points as one COPY text body, built in one pass (psycopg's write_row adapts each value in
    Python: a third of a 13,000-point tick)."""
    stamps: dict[dt.datetime, str] = {}
    lines = []
    for resolution, kind, subject, at, values in points:
        stamp = stamps.get(at)
        if stamp is None:
            stamp = stamps[at] = at.isoformat()
        values_text = _copy_field(orjson.dumps(values).decode())
        lines.append(f"{resolution}\t{kind}\t{_copy_field(subject)}\t{stamp}\t{values_text}\n")
    return "".join(lines)


def _insert(points: list[Point]) -> int:
    """Writes `points`, skipping any bucket of a subject already written; returns the points offered.

    On PostgreSQL one COPY: a tick's 13,000 points at 1,000 hosts take a tenth of the time of the
    multi-row INSERT Django builds (benchmarks/rollup_writes.py). COPY cannot skip conflicts, so a
    bucket written before (a tick run twice) makes it fail whole, inside its savepoint, and the points
    go through INSERT ... ON CONFLICT DO NOTHING instead: nothing is written twice or half.
    """
    if not points:
        return 0
    if connection.vendor == "postgresql":
        sql = f"COPY {TABLE} (resolution_s, kind, subject, bucket, values) FROM STDIN"
        began = time.monotonic()
        try:
            # Through Django's wrapper of the driver's errors, so a conflict is an IntegrityError.
            with (
                transaction.atomic(),
                connection.cursor() as cursor,
                connection.wrap_database_errors,
                cursor.cursor.copy(sql) as copy,
            ):
                copy.write(_copy_text(points))
            return len(points)
        except IntegrityError:
            pass
        finally:
            if connection.queries_logged:  # as Django's debug cursor logs what goes through execute()
                connection.queries_log.append(
                    {"sql": f"{sql} -- {len(points)} rows", "time": f"{time.monotonic() - began:.3f}"}
                )
    MetricRollup.objects.bulk_create(
        [
            MetricRollup(
                resolution_s=r,
                kind=k,
                subject=sub,
                bucket=at,
                # A host point kept as written (collect_live) is JSON text: the ORM wants the value.
                values=orjson.loads(orjson.dumps(v)) if isinstance(v, orjson.Fragment) else v,
            )
            for r, k, sub, at, v in points
        ],
        ignore_conflicts=True,
    )
    return len(points)


def rollup_tick(now: float | None = None) -> int:
    """One beat tick: the 10 s points of GPUs, engines, pools and tenants, in one insert. Rows offered."""
    now = time.time() if now is None else now
    return _insert(collect_live(now) + collect_requests(now))


@dataclass
class Aggregated:
    resolution_s: int
    buckets: int  # finished by this run
    rows: int
    slices: int = 0  # written by this run (PostgreSQL, `aggregate_slice`): 0 when nothing was left


def _missing(resolution: int, candidates: list[float]) -> list[float]:
    """The candidate buckets with no point yet at `resolution`, oldest first (SQLite; PostgreSQL keeps
    each bucket's progress, `aggregate_slice`)."""
    done = set(
        MetricRollup.objects.filter(resolution_s=resolution, bucket__in=[_at(c) for c in candidates])
        .values_list("bucket", flat=True)
        .distinct()
    )
    return sorted(c for c in candidates if _at(c) not in done)


def _means_sql(fields: int) -> str:
    """Per member, from its finer points `p` (float8[]): the samples' total `n` and each field's mean
    `m<i>` weighted by them, null where no sample had the field (stats.combine_gauges, in SQL)."""
    means = [
        f"sum(p[1] * p[{i + 1}]) / nullif(sum(CASE WHEN p[{i + 1}] IS NOT NULL THEN p[1] END), 0) AS m{i}"
        for i in range(1, fields + 1)
    ]
    return f"sum(p[1])::bigint AS n, {', '.join(means)}"


def _point_sql(fields: int) -> str:
    """A coarser point as stats.encode_gauges keeps it: `"n,mean,..."`, the means rounded to
    SIGNIFICANT digits, empty where null."""
    rounded = [
        f"(CASE WHEN m{i} = 0 THEN 0 "
        f"ELSE round(m{i}::numeric, {SIGNIFICANT - 1} - floor(log(abs(m{i})))::int) END)::float8::text"
        for i in range(1, fields + 1)
    ]
    return f"to_jsonb(array_to_string(ARRAY[n::text, {', '.join(rounded)}], ',', ''))"


def _finer_point_sql(finer: int, fields: int) -> str:
    """A finer point of member `m` as float8[]: a 10 s point is a JSON list (`[1, 61.0, null]`), read
    element by element; a coarser one is stats.encode_gauges text (`"1,61,"`), split."""
    if finer == TICK_SECONDS:
        return f"ARRAY[{', '.join(f'(m.value->>{i})::float8' for i in range(fields + 1))}]"
    return "string_to_array(m.value #>> '{}', ',', '')::float8[]"


def _aggregate_gauges(
    resolution: int, missing: list[float], hosts: tuple[str | None, str | None] = (None, None)
) -> tuple[int, set[float]]:
    """The GPUs' and engines' coarser points of the `missing` buckets, one INSERT ... SELECT per bucket
    (usually one a run): each host row's members unnested, combined per member, and packed again per
    host. The finer points never leave PostgreSQL (at 1,000 hosts x 8 GPUs a minute is 78,000 of
    them). `hosts`: only the host rows after the first name and up to the second (either None: open).
    Returns (rows written, buckets written)."""
    fields = max(len(f) for f in GAUGE_FIELDS.values())
    after, upto = hosts
    bounds = ("AND subject > %s " if after is not None else "") + (
        "AND subject <= %s " if upto is not None else ""
    )
    sql = (
        f"INSERT INTO {TABLE} (resolution_s, kind, subject, bucket, values) "
        f"SELECT %s, kind, subject, %s, jsonb_object_agg(member, {_point_sql(fields)}) FROM "
        f"(SELECT kind, subject, member, {_means_sql(fields)} FROM "
        f"(SELECT kind, subject, m.key AS member, {_finer_point_sql(FINER[resolution], fields)} AS p "
        f"FROM {TABLE}, jsonb_each(values) AS m WHERE resolution_s = %s AND kind = ANY(%s) "
        # OFFSET 0 keeps the subquery whole, so `p` is parsed once a row; inlined, PostgreSQL parsed it
        # again at each of its 13 uses (8.8 s instead of 0.2 s for a minute at 1,000 hosts).
        f"AND jsonb_typeof(values) = 'object' AND bucket >= %s AND bucket < %s {bounds}OFFSET 0) AS finer "
        "GROUP BY kind, subject, member) AS members "
        "GROUP BY kind, subject ON CONFLICT DO NOTHING"
    )
    rows, written = 0, set()
    with transaction.atomic(), connection.cursor() as cursor:
        # The groups (13,000 members a minute at 1,000 hosts) fit in memory; with the default 4 MB a
        # hash aggregate spilled to disk and took seconds. SET LOCAL: for this transaction only.
        cursor.execute("SET LOCAL work_mem = '64MB'")
        for bucket in missing:
            cursor.execute(
                sql,
                [
                    resolution,
                    _at(bucket),
                    FINER[resolution],
                    list(PACKED_KINDS),
                    _at(bucket),
                    _at(bucket + resolution),
                    *(name for name in hosts if name is not None),
                ],
            )
            if cursor.rowcount:
                rows += cursor.rowcount
                written.add(bucket)
    return rows, written


def _combine(kind: str, values: list[Any]) -> Any:
    if kind in REQUEST_KINDS:
        return stats.combine_requests(values)
    members: dict[str, list[Any]] = {}
    for packed in values:
        if isinstance(packed, dict):
            for member, point in packed.items():
                members.setdefault(member, []).append(point)
    return {member: stats.encode_gauges(stats.combine_gauges(points)) for member, points in members.items()}


def aggregate(resolution: int, now: float | None = None) -> Aggregated:
    """Writes coarser points (`resolution` 60 or 3600) from the finer points: on PostgreSQL one slice of
    the oldest settled bucket not yet written (`aggregate_slice`: the gauges in an INSERT ... SELECT,
    the request points read, combined and written in one insert); on SQLite (the demo) every settled
    bucket not yet written, all in Python."""
    now = time.time() if now is None else now
    if connection.vendor == "postgresql":
        return aggregate_slice(resolution, now)
    missing = _missing(resolution, _candidates(resolution, now))
    if not missing:
        return Aggregated(resolution, 0, 0)
    rows, written = _aggregate_in_python(resolution, missing, (*PACKED_KINDS, *REQUEST_KINDS))
    return Aggregated(resolution, len(written), rows)


def _candidates(resolution: int, now: float) -> list[float]:
    """The settled buckets a run looks at, newest first: the last one settled and LOOKBACK_BUCKETS - 1
    before it (a run missed is caught up by the next)."""
    last = bucket_start(now - SETTLE_SECONDS, resolution) - resolution
    return [last - k * resolution for k in range(LOOKBACK_BUCKETS[resolution])]


def _aggregate_in_python(
    resolution: int,
    missing: list[float],
    kinds: tuple[str, ...],
    subjects: dict[str, list[str]] | None = None,
) -> tuple[int, set[float]]:
    """The coarser points of `kinds` in the `missing` buckets (only `subjects`, by kind, if given), from
    their finer points read and combined here: the request points everywhere, every kind on SQLite.
    Returns (rows, buckets) written."""
    groups: dict[tuple[str, str, float], list[Any]] = {}
    which = Q(kind__in=kinds)
    if subjects is not None:
        which = Q(pk__in=[])
        for kind, names in subjects.items():
            which |= Q(kind=kind, subject__in=names)
    # The values as text, parsed by orjson: the JSON field's own loader (json.loads) took as long as
    # combining them (a request point is about 1.3 kB: three parts with two histograms each).
    finer_rows = MetricRollup.objects.filter(
        which,
        resolution_s=FINER[resolution],
        bucket__gte=_at(missing[0]),
        bucket__lt=_at(missing[-1] + resolution),
    ).values_list("kind", "subject", "bucket", Cast("values", TextField()))
    wanted = set(missing)
    for kind, subject, bucket, text in finer_rows.iterator(chunk_size=5000):
        coarse = bucket_start(bucket.timestamp(), resolution)
        if coarse in wanted:
            groups.setdefault((kind, subject, coarse), []).append(orjson.loads(text))
    points = [
        _row(resolution, kind, subject, _at(coarse), _combine(kind, values))
        for (kind, subject, coarse), values in groups.items()
    ]
    return _insert(points), {coarse for _, _, coarse in groups}


# A bucket's GPU and engine rows are written in at most this many slices of hosts (more hosts, bigger
# slices), so that with its request slices a minute fits the 12 runs of its minute (beat every 5 s)
# and an hour the 360 of its hour (every 10 s), with room to catch up a missed one.
HOST_SLICES_AT_MOST = {60: 8, 3600: 200}


def aggregate_slice(resolution: int, now: float | None = None) -> Aggregated:
    """One slice of the oldest settled bucket of `resolution` (60 or 3600) whose points are not all
    written (PostgreSQL): the GPU and engine rows of the next hosts by name (HISTORY_MINUTE_HOSTS_PER_RUN
    or HISTORY_HOUR_HOSTS_PER_RUN of them, more past HOST_SLICES_AT_MOST slices), or once every host is
    in, the pools' and tenants' rows (a minute's all at once, an hour's
    HISTORY_HOUR_REQUEST_SUBJECTS_PER_RUN at a time). routing.models.HistoryProgress keeps where the
    next slice starts. `buckets` is 1 when the run finished its bucket; `slices` 0 when there was
    nothing to write.

    Why slices: at 1,000 hosts x 8 GPUs a minute is 78,000 10 s points of GPUs and engines (215-365 ms
    in one run) and an hour 780,000 minute points and 13,200 request points of 220 pools and tenants
    (2.4-4.7 s in one run, once an hour; benchmarks/rollup_writes.py). Beat runs a minute's slice every
    5 s and an hour's every 10 s (`routing.aggregate_history`, `routing.aggregate_history_hours`): such
    a fleet's minute is in nine runs (45 s), its hour in about 115 (20 minutes); a fleet of 125 hosts
    and 15 pools and tenants has both in two runs. Until a bucket is done, its request series read as
    not yet written (`newest_request_bucket`), not as no requests."""
    now = time.time() if now is None else now
    candidates = _candidates(resolution, now)
    oldest = _at(candidates[-1])
    HistoryProgress.objects.filter(resolution_s=resolution, bucket__lt=oldest).delete()
    done = set(
        HistoryProgress.objects.filter(resolution_s=resolution, bucket__gte=oldest, done=True).values_list(
            "bucket", flat=True
        )
    )
    todo = [c for c in sorted(candidates) if _at(c) not in done]
    if not todo:
        return Aggregated(resolution, 0, 0)
    with connection.cursor() as cursor:
        # Per bucket: are there finer points to make it from, and points already (written whole by the
        # version before the slices, which kept no progress row)?
        cursor.execute(
            f"SELECT b, EXISTS (SELECT 1 FROM {TABLE} WHERE resolution_s = %s AND bucket >= b "
            f"AND bucket < b + make_interval(secs => %s)), "
            f"EXISTS (SELECT 1 FROM {TABLE} WHERE resolution_s = %s AND bucket = b) "
            "FROM unnest(%s::timestamptz[]) AS b",
            [FINER[resolution], resolution, resolution, [_at(c) for c in todo]],
        )
        probes = {row[0].timestamp(): (row[1], row[2]) for row in cursor.fetchall()}
    for bucket in todo:
        has_finer, has_points = probes[bucket]
        if not has_finer:
            continue
        with transaction.atomic():
            progress, created = HistoryProgress.objects.select_for_update().get_or_create(
                resolution_s=resolution, bucket=_at(bucket)
            )
            if progress.done:
                continue  # another run finished it since the read above
            if created and has_points:
                progress.done = True
                progress.save(update_fields=["done"])
                continue
            if progress.phase == HistoryProgress.Phase.HOSTS:
                rows = _write_hosts_slice(resolution, bucket, progress)
            else:
                rows = _write_requests_slice(resolution, bucket, progress)
            progress.save(update_fields=["phase", "after", "done"])
            return Aggregated(resolution, 1 if progress.done else 0, rows, slices=1)
    return Aggregated(resolution, 0, 0)


def _write_hosts_slice(resolution: int, bucket: float, progress: HistoryProgress) -> int:
    """The GPU and engine rows of the next hosts after `progress.after`; the last slice is open-ended,
    so the slices cover every name (rows of hosts deleted since are written too) and move `progress`
    to the request phase."""
    after = progress.after or None
    names = Host.objects.order_by("name").values_list("name", flat=True)
    per_run = (
        settings.HISTORY_MINUTE_HOSTS_PER_RUN if resolution == 60 else settings.HISTORY_HOUR_HOSTS_PER_RUN
    )
    per_run = max(per_run, -(-names.count() // HOST_SLICES_AT_MOST[resolution]))
    if after is not None:
        names = names.filter(name__gt=after)
    ends = list(names[per_run - 1 : per_run + 1])
    upto = ends[0] if len(ends) == 2 else None
    rows, _ = _aggregate_gauges(resolution, [bucket], hosts=(after, upto))
    if upto is None:
        progress.phase, progress.after = HistoryProgress.Phase.REQUESTS, ""
    else:
        progress.after = upto
    return rows


def _write_requests_slice(resolution: int, bucket: float, progress: HistoryProgress) -> int:
    """The pool and tenant rows: a minute's all at once (the health figures read a minute's pools
    together), an hour's the next HISTORY_HOUR_REQUEST_SUBJECTS_PER_RUN subjects in (kind, subject)
    order after `progress.after` (`<kind>:<subject>`). None left: the bucket is done."""
    if resolution == 60:
        progress.done = True
        return _aggregate_in_python(resolution, [bucket], REQUEST_KINDS)[0]
    per_run = settings.HISTORY_HOUR_REQUEST_SUBJECTS_PER_RUN
    after_kind, _, after_subject = progress.after.partition(":")
    with connection.cursor() as cursor:
        # Along the (kind, subject, resolution_s, bucket) unique index, so it stops after `per_run`.
        cursor.execute(
            f"SELECT DISTINCT kind, subject FROM {TABLE} WHERE kind = ANY(%s) AND resolution_s = %s "
            "AND bucket >= %s AND bucket < %s AND (kind, subject) > (%s, %s) "
            "ORDER BY kind, subject LIMIT %s",
            [
                list(REQUEST_KINDS),
                FINER[resolution],
                _at(bucket),
                _at(bucket + resolution),
                after_kind,
                after_subject,
                per_run + 1,
            ],
        )
        pairs = cursor.fetchall()
    subjects: dict[str, list[str]] = {}
    for kind, subject in pairs[:per_run]:
        subjects.setdefault(kind, []).append(subject)
    rows = _aggregate_in_python(resolution, [bucket], REQUEST_KINDS, subjects)[0] if pairs else 0
    if len(pairs) <= per_run:
        progress.done = True
    else:
        progress.after = f"{pairs[per_run - 1][0]}:{pairs[per_run - 1][1]}"
    return rows


def newest_request_bucket(resolution: int) -> float | None:
    """The newest bucket of `resolution` whose request points are all written (a request series reads
    a bucket without a point as no requests up to it): the newest one written, but before a bucket whose
    slices are still being written (`aggregate_slice`)."""
    newest = MetricRollup.objects.filter(resolution_s=resolution, kind__in=REQUEST_KINDS).aggregate(
        newest=Max("bucket")
    )["newest"]
    if newest is None:
        return None
    unfinished = HistoryProgress.objects.filter(
        resolution_s=resolution, done=False, bucket__lte=newest
    ).aggregate(first=Min("bucket"))["first"]
    if unfinished is not None:
        return unfinished.timestamp() - resolution
    return newest.timestamp()


def prune(now: float | None = None) -> partitions.HistoryMaintenance:
    """Each resolution's points past its retention go: whole partitions dropped on PostgreSQL (the
    coming ones created ahead, and the oldest finest ones past HISTORY_MAX_GB on disk;
    routing/rollups/partitions.py), rows deleted on SQLite."""
    now = time.time() if now is None else now
    keep = {resolution: keep_seconds(resolution) for resolution in RESOLUTIONS}
    return partitions.maintain(now, keep, settings.HISTORY_MAX_GB * 1e9)
