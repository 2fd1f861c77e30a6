"""The charts' history table, partitioned per resolution and period, and its retention by DROP.

On PostgreSQL `routing_metricrollup` is partitioned by RANGE (resolution_s, bucket) (migration 0014):
one partition per resolution and PERIOD (10 s points by the hour, 1 min points by 6 hours, 1 h points
by 10 days), plus a DEFAULT partition so an insert never fails for want of a partition. Maintenance
(hourly, `routing.prune_history`) creates each resolution's current partition and the next AHEAD ones
(moving in any rows the default caught for them) and drops every partition whose whole range is past
its resolution's retention: a catalog change instead of a DELETE of millions of rows, and no dead rows
for VACUUM. A point is therefore kept at least its HISTORY_KEEP_* and at most one PERIOD more. Rows the
default partition holds past retention are deleted (usually none). On SQLite (the demo) the table is
plain and retention deletes rows.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.db.models import Q

from core import partitions
from routing.models import MetricRollup

log = logging.getLogger(__name__)

TABLE = MetricRollup._meta.db_table
# The span of one partition per resolution. A point outlives its retention by up to one span, so the
# spans are short next to the retentions (an hour of 24, 6 hours of 7 days, 10 days of 90) and divide
# them, which keeps the disk close to what the settings say (docs/capacity.md, "History on disk").
PERIOD = {10: 3600, 60: 6 * 3600, 3600: 10 * 86400}
AHEAD = {10: 3, 60: 2, 3600: 1}  # partitions ready past the current one (maintenance runs hourly)
# Over the disk budget, partitions go finest resolution first, but never the last FLOOR seconds of a
# resolution: the 15 min and 1 h charts keep their 10 s points, 24 h its 1 min points, 7 days its 1 h.
FLOOR = {10: 3600, 60: 86400, 3600: 7 * 86400}
RESOLUTION_ORDER = (10, 60, 3600)
# pg_try_advisory_lock key shared by every process that maintains the history ("rollup").
MAINTENANCE_LOCK = 0x726F6C6C7570
_PARTITION = re.compile(rf"^{TABLE}_r(\d+)_(\d{{10}})$")


@dataclass
class HistoryMaintenance:
    """What one maintenance run did (JSON-serialisable through `as_dict` for the Celery result)."""

    partitioned: bool
    skipped: bool = False  # another process held the maintenance lock; it is doing the same work
    created: list[str] = field(default_factory=list)
    moved_rows: int = 0  # rows moved from the default partition into a new partition
    dropped: list[str] = field(default_factory=list)
    deleted_rows: dict[str, int] = field(default_factory=dict)  # per resolution ("10"), row by row
    failed: list[str] = field(default_factory=list)  # steps that hit the lock timeout; retried next run
    dropped_for_size: list[str] = field(default_factory=list)  # over HISTORY_MAX_GB, oldest finest first
    bytes_before: int = 0  # the history's partitions on disk before and after the size limit
    bytes_after: int = 0
    headroom_bytes: int = 0  # left free for the next hour's points (hourly_growth)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def period_start(resolution: int, ts: float) -> int:
    return int(ts // PERIOD[resolution]) * PERIOD[resolution]


def partition_name(resolution: int, start: int) -> str:
    return f"{TABLE}_r{resolution}_{dt.datetime.fromtimestamp(start, dt.UTC):%Y%m%d%H}"


def _literal(ts: int) -> str:
    return f"{dt.datetime.fromtimestamp(ts, dt.UTC):%Y-%m-%d %H:%M:%S}+00"


def create_partition(resolution: int, start: int) -> tuple[bool, int]:
    """The partition of `resolution`'s points from `start` (a PERIOD boundary) for one PERIOD."""
    lo, hi = _literal(start), _literal(start + PERIOD[resolution])
    return partitions.create_range_partition(
        TABLE,
        partition_name(resolution, start),
        f"FROM ({resolution}, '{lo}') TO ({resolution}, '{hi}')",
        f"resolution_s = {resolution} AND bucket >= '{lo}' AND bucket < '{hi}'",
    )


def _parse(name: str) -> tuple[int, float] | None:
    """(resolution, start) of a partition named by partition_name; None for the default or others."""
    m = _PARTITION.match(name)
    if m is None or int(m[1]) not in PERIOD:
        return None
    return int(m[1]), dt.datetime.strptime(m[2], "%Y%m%d%H").replace(tzinfo=dt.UTC).timestamp()


def _expired(names: set[str], cutoffs: dict[int, float]) -> list[str]:
    out = []
    for name in names:
        parsed = _parse(name)
        if parsed and parsed[0] in cutoffs and parsed[1] + PERIOD[parsed[0]] <= cutoffs[parsed[0]]:
            out.append(name)
    return sorted(out)


def _delete_old_rows(table: str, cutoffs: dict[int, float]) -> dict[str, int]:
    deleted: dict[str, int] = {}
    for resolution, cutoff in cutoffs.items():
        if table == TABLE:
            deleted[str(resolution)], _ = MetricRollup.objects.filter(
                Q(resolution_s=resolution) & Q(bucket__lt=dt.datetime.fromtimestamp(cutoff, dt.UTC))
            ).delete()
        else:
            with connection.cursor() as cursor:
                cursor.execute(
                    f"DELETE FROM {table} WHERE resolution_s = %s AND bucket < %s",
                    [resolution, dt.datetime.fromtimestamp(cutoff, dt.UTC)],
                )
                deleted[str(resolution)] = cursor.rowcount
    return deleted


def maintain(now: float, keep: dict[int, float], max_bytes: float = float("inf")) -> HistoryMaintenance:
    """Partitions ahead, retention (`keep`: seconds per resolution) by dropping whole partitions, and
    the disk held within `max_bytes` (the oldest, finest partitions dropped first, down to FLOOR).

    Idempotent and safe from several processes at once (a PostgreSQL advisory lock: the others return
    `skipped`). Each DDL step gives up after core.partitions.LOCK_TIMEOUT and is retried next run.
    """
    cutoffs = {resolution: now - seconds for resolution, seconds in keep.items()}
    if not partitions.is_partitioned(TABLE):
        return HistoryMaintenance(partitioned=False, deleted_rows=_delete_old_rows(TABLE, cutoffs))
    result = HistoryMaintenance(partitioned=True)
    with partitions.maintenance_lock(MAINTENANCE_LOCK) as held:
        if not held:
            result.skipped = True
            return result
        _maintain(result, now, cutoffs, max_bytes)
    return result


def _maintain(result: HistoryMaintenance, now: float, cutoffs: dict[int, float], max_bytes: float) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        partitions.set_lock_timeout(cursor)
        partitions.ensure_default(cursor, TABLE)
        # Periods the default caught (beat was down, a clock ran ahead) that are still inside retention
        # get their partition now; older rows are deleted below.
        wanted: set[tuple[int, int]] = set()
        for resolution, period in PERIOD.items():
            cursor.execute(
                f"SELECT DISTINCT floor(extract(epoch FROM bucket) / %s)::bigint * %s FROM {TABLE}_default "
                "WHERE resolution_s = %s AND bucket >= %s",
                [period, period, resolution, dt.datetime.fromtimestamp(cutoffs[resolution], dt.UTC)],
            )
            wanted.update((resolution, int(row[0])) for row in cursor.fetchall())
            current = period_start(resolution, now)
            wanted.update((resolution, current + k * period) for k in range(AHEAD[resolution] + 1))
    for resolution, start in sorted(wanted):
        try:
            created, moved = create_partition(resolution, start)
        except DatabaseError as exc:
            log.warning("history: partition %s not created (%s)", partition_name(resolution, start), exc)
            result.failed.append(partition_name(resolution, start))
            continue
        if created:
            result.created.append(partition_name(resolution, start))
            result.moved_rows += moved

    with connection.cursor() as cursor:
        expired = _expired(partitions.attached(cursor, TABLE), cutoffs)
    for name in expired:
        try:
            partitions.drop_partition(name)
        except DatabaseError as exc:
            log.warning("history: partition %s not dropped (%s); retrying next run", name, exc)
            result.failed.append(name)
            continue
        result.dropped.append(name)
    # What the default partition holds past retention: usually nothing, a short scan of a small table.
    result.deleted_rows = _delete_old_rows(f"{TABLE}_default", cutoffs)
    _keep_within(result, max_bytes, now)


def hourly_growth(sized: list[tuple[int, int]]) -> int:
    """What the history may grow by until the next (hourly) run, from its partitions' sizes
    (`(resolution, bytes)`): the biggest hour of 10 s points, the share of an hour of the biggest
    partition of each coarser resolution."""
    growth = 0.0
    for resolution, period in PERIOD.items():
        sizes = [size for r, size in sized if r == resolution]
        if sizes:
            growth += max(sizes) * min(1.0, 3600 / period)
    return int(growth)


def _keep_within(result: HistoryMaintenance, max_bytes: float, now: float) -> None:
    """Past `max_bytes` on disk, the oldest partitions go, finest resolution first, down to FLOOR.

    Like Prometheus's `--storage.tsdb.retention.size` beside its retention time: a small fleet keeps
    every point for its HISTORY_KEEP_*, a big one keeps what fits the budget (1,000 hosts x 8 GPUs:
    docs/capacity.md, "History on disk"). Room is left for what the next hour writes (hourly_growth),
    so the disk stays within the budget between runs too.
    """
    parts = []
    sized = []
    total = 0
    for name, _, size in partitions.sizes(TABLE):
        total += size
        parsed = _parse(name)
        if parsed:
            resolution, start = parsed
            sized.append((resolution, size))
            # Only whole periods older than the floor; the newest points are never dropped for size.
            if start + PERIOD[resolution] <= now - FLOOR.get(resolution, 0):
                parts.append((RESOLUTION_ORDER.index(resolution), start, name, size))
    result.headroom_bytes = hourly_growth(sized)
    max_bytes -= result.headroom_bytes
    result.bytes_before = total
    for _, _, name, size in sorted(parts):
        if total <= max_bytes:
            break
        try:
            partitions.drop_partition(name)
        except DatabaseError as exc:
            log.warning("history: partition %s not dropped (%s); retrying next run", name, exc)
            result.failed.append(name)
            continue
        result.dropped_for_size.append(name)
        total -= size
    result.bytes_after = total
    if total > max_bytes:
        log.warning(
            "history: %.2f GB on disk and %.2f GB to come this hour, over HISTORY_MAX_GB (%.2f GB), with "
            "every resolution at its floor",
            total / 1e9,
            result.headroom_bytes / 1e9,
            (max_bytes + result.headroom_bytes) / 1e9,
        )
