"""Domain logic of routing outside the hot path: request-log partitions and retention, and telling
the proxies that a rollout or shadow configuration changed.

On PostgreSQL the request log is partitioned by RANGE (created_at), one partition per UTC day, plus
a DEFAULT partition so an insert never fails for want of a partition (migration 0003). Maintenance
creates today's and the next `REQUEST_LOG_PARTITIONS_AHEAD` days' partitions (moving any rows the
default partition caught for those days), and retention drops whole days older than
`REQUEST_LOG_RETENTION_DAYS`: a catalog change instead of a DELETE of millions of rows. On SQLite
(the demo) the table is plain and retention deletes rows in batches.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from core import partitions
from core.redis_client import publish_config_change
from routing.models import RequestLog

log = logging.getLogger(__name__)

PRUNE_BATCH = 10_000
# pg_try_advisory_lock key shared by every process that maintains the request log ("reqlog").
MAINTENANCE_LOCK = 0x7265716C6F67
TABLE = RequestLog._meta.db_table
DEFAULT_PARTITION = f"{TABLE}_default"
_DAY_PARTITION = re.compile(rf"^{TABLE}_p(\d{{8}})$")


@dataclass
class RequestLogMaintenance:
    """What one maintenance run did (JSON-serialisable through `as_dict` for the Celery result)."""

    partitioned: bool
    skipped: bool = False  # another process held the maintenance lock; it is doing the same work
    created: list[str] = field(default_factory=list)
    moved_rows: int = 0  # rows moved from the default partition into a new day partition
    dropped: list[str] = field(default_factory=list)
    deleted_rows: int = 0  # rows deleted one by one (SQLite, or stale rows in the default partition)
    failed: list[str] = field(default_factory=list)  # steps that hit the lock timeout; retried next run

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RequestLogPartition:
    """One partition of the request log: its day (None for the default), size and row estimate."""

    name: str
    day: dt.date | None
    rows_estimate: int | None  # pg_class.reltuples; None until the partition was first analysed
    total_bytes: int


def prune_request_log(retention_days: int | None = None, *, batch: int = PRUNE_BATCH) -> int:
    """Delete request-log rows older than the retention period, in id batches; returns rows deleted.

    The retention of a plain (unpartitioned) table. Batches keep each DELETE short so the proxy's
    inserts never queue behind one huge transaction.
    """
    days = settings.REQUEST_LOG_RETENTION_DAYS if retention_days is None else retention_days
    cutoff = timezone.now() - dt.timedelta(days=days)
    deleted = 0
    while True:
        ids = list(RequestLog.objects.filter(created_at__lt=cutoff).values_list("id", flat=True)[:batch])
        if not ids:
            return deleted
        deleted += RequestLog.objects.filter(id__in=ids)._raw_delete(RequestLog.objects.db)


def request_log_is_partitioned() -> bool:
    """True when the request-log table is a partitioned PostgreSQL table."""
    return partitions.is_partitioned(TABLE)


def partition_name(day: dt.date) -> str:
    return f"{TABLE}_p{day:%Y%m%d}"


def _bounds(day: dt.date) -> tuple[str, str]:
    """The UTC day's half-open range as timestamptz literals."""
    return f"{day.isoformat()} 00:00:00+00", f"{(day + dt.timedelta(days=1)).isoformat()} 00:00:00+00"


def _utc_today() -> dt.date:
    return timezone.now().astimezone(dt.UTC).date()


def create_request_log_partition(day: dt.date) -> tuple[bool, int]:
    """Create the partition for one UTC day unless it exists; returns (created, rows moved into it from
    the default partition). core/partitions.py says how without stopping the proxy's inserts."""
    lo, hi = _bounds(day)
    return partitions.create_range_partition(
        TABLE,
        partition_name(day),
        f"FROM ('{lo}') TO ('{hi}')",
        f"created_at IS NOT NULL AND created_at >= '{lo}' AND created_at < '{hi}'",
    )


def _maintain_partitions(
    result: RequestLogMaintenance, today: dt.date, ahead: int, retention_days: int
) -> None:
    oldest_kept = today - dt.timedelta(days=retention_days)
    with transaction.atomic(), connection.cursor() as cursor:
        partitions.set_lock_timeout(cursor)
        partitions.ensure_default(cursor, TABLE)
        # Days the default partition caught (the beat was down, or a clock ran ahead) that are still
        # inside retention get their partition now; older ones are deleted below.
        cursor.execute(
            f"SELECT DISTINCT (created_at AT TIME ZONE 'UTC')::date FROM {DEFAULT_PARTITION} "
            "WHERE created_at >= %s AND created_at < %s",
            [_bounds(oldest_kept)[0], _bounds(today + dt.timedelta(days=ahead))[1]],
        )
        days = {row[0] for row in cursor.fetchall()}
    days.update(today + dt.timedelta(days=n) for n in range(ahead + 1))
    for day in sorted(days):
        try:
            created, moved = create_request_log_partition(day)
        except DatabaseError as exc:
            log.warning("request log: partition for %s not created (%s); retrying next run", day, exc)
            result.failed.append(partition_name(day))
            continue
        if created:
            result.created.append(partition_name(day))
            result.moved_rows += moved

    # Retention: whole days before the oldest kept day go, so a row is kept at least
    # REQUEST_LOG_RETENTION_DAYS and at most one day more.
    with connection.cursor() as cursor:
        expired = sorted(
            name
            for name in partitions.attached(cursor, TABLE)
            if (m := _DAY_PARTITION.match(name)) and dt.datetime.strptime(m[1], "%Y%m%d").date() < oldest_kept
        )
    for name in expired:
        try:
            partitions.drop_partition(name)
        except DatabaseError as exc:
            log.warning("request log: partition %s not dropped (%s); retrying next run", name, exc)
            result.failed.append(name)
            continue
        result.dropped.append(name)

    # Rows the default partition holds from before the oldest kept day (the migration puts rows older
    # than retention there): usually none, so a short scan of a small table.
    cutoff = _bounds(oldest_kept)[0]
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {DEFAULT_PARTITION} WHERE ctid IN (SELECT ctid FROM {DEFAULT_PARTITION} "
                "WHERE created_at < %s LIMIT %s)",
                [cutoff, PRUNE_BATCH],
            )
            result.deleted_rows += cursor.rowcount
            if cursor.rowcount < PRUNE_BATCH:
                return


def maintain_request_log(
    *, today: dt.date | None = None, ahead: int | None = None, retention_days: int | None = None
) -> RequestLogMaintenance:
    """Create the coming days' partitions and drop those past retention (row pruning on SQLite).

    Idempotent and safe to run from several processes at once: one holds a PostgreSQL advisory
    lock, the others return at once with `skipped`. Never blocks the proxy: its inserts do not wait
    on this (each DDL step gives up after core.partitions.LOCK_TIMEOUT and is retried on the next run).
    """
    days = settings.REQUEST_LOG_RETENTION_DAYS if retention_days is None else retention_days
    if not request_log_is_partitioned():
        return RequestLogMaintenance(partitioned=False, deleted_rows=prune_request_log(days))
    result = RequestLogMaintenance(partitioned=True)
    with partitions.maintenance_lock(MAINTENANCE_LOCK) as held:
        if not held:
            result.skipped = True
            return result
        _maintain_partitions(
            result,
            _utc_today() if today is None else today,
            settings.REQUEST_LOG_PARTITIONS_AHEAD if ahead is None else ahead,
            days,
        )
    return result


def request_log_partitions() -> list[RequestLogPartition]:
    """The request log's partitions, oldest day first and the default last (empty when unpartitioned)."""
    if not request_log_is_partitioned():
        return []
    parts = []
    for name, rows, size in partitions.sizes(TABLE):
        m = _DAY_PARTITION.match(name)
        day = dt.datetime.strptime(m[1], "%Y%m%d").date() if m else None
        parts.append(RequestLogPartition(name, day, rows, size))
    return sorted(parts, key=lambda p: (p.day is None, p.day or dt.date.min, p.name))


def publish_rollout_change(kind: str, pk: int, alias_id: int) -> None:
    """Tell every proxy process that a Rollout or ShadowConfig of an alias changed.

    Sent after the transaction commits; each proxy reloads its routing snapshot on it (within about
    50 ms plus one snapshot load), so a new share, a pause, a rollback or a shadow percentage takes
    effect within a second. `save()` and `delete()` of either model call this already (routing.signals);
    code that changes rows with `QuerySet.update()` must call it itself.
    """
    publish_config_change(kind, id=pk, alias_id=alias_id)
