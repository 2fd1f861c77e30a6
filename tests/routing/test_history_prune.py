"""Retention of the charts' history: on PostgreSQL whole partitions are dropped once their range is past
their resolution's retention (24 h of 10 s, 7 days of 1 min, 90 days of 1 h by default), the coming ones
are created ahead, and rows the default partition caught are moved into their partition or, past
retention, deleted. A point is kept at least its retention and at most one partition period more."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from django.db import connection

from core import partitions as pg_partitions
from routing.models import MetricRollup
from routing.rollups import partitions, services

pytestmark = pytest.mark.django_db

KEEP = {10: 86400.0, 60: 7 * 86400.0, 3600: 90 * 86400.0}


def put(resolution: int, subject: str, ts: float) -> None:
    MetricRollup.objects.create(
        resolution_s=resolution,
        kind="gpu",
        subject=subject,
        bucket=dt.datetime.fromtimestamp(ts, dt.UTC),
        values=[1],
    )


def where(subject: str) -> str:
    """The partition that holds a subject's row."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT tableoid::regclass::text FROM {partitions.TABLE} WHERE subject = %s", [subject]
        )
        return cursor.fetchone()[0]


def test_the_history_table_is_partitioned() -> None:
    assert pg_partitions.is_partitioned(partitions.TABLE)
    now = time.time()
    put(10, "now", now)
    # The migration made the current hour's partition of 10 s points: the row lands there.
    assert where("now") == partitions.partition_name(10, partitions.period_start(10, now))


def test_retention_drops_whole_partitions_and_deletes_what_the_default_caught() -> None:
    # Every cutoff (now - retention) falls on a partition boundary of its resolution (10 days divides
    # 90 days, 6 hours divides 7 days, an hour divides 24 h): a point 60 s before it is in an expired
    # period, one 60 s after it is kept. Two 10-day periods ahead, so that no partition the migration
    # made (around the real now) holds any of these points.
    period = partitions.PERIOD[3600]
    now = float((int(time.time()) // period + 2) * period)
    for resolution, keep in KEEP.items():
        put(resolution, f"old:{resolution}", now - keep - 60)
        put(resolution, f"kept:{resolution}", now - keep + 60)
    # The old 10 s point's hour gets a partition of its own (as if beat had made it then), so it goes
    # by DROP; the others sit in the default partition until maintenance.
    old_hour = partitions.period_start(10, now - KEEP[10] - 60)
    partitions.create_partition(10, old_hour)
    assert where("old:10") == partitions.partition_name(10, old_hour)
    assert where("kept:60") == f"{partitions.TABLE}_default"

    result = services.prune(now)

    assert result.partitioned and not result.failed
    assert partitions.partition_name(10, old_hour) in result.dropped
    assert result.deleted_rows == {"10": 0, "60": 1, "3600": 1}
    assert sorted(MetricRollup.objects.values_list("subject", flat=True)) == [
        "kept:10",
        "kept:3600",
        "kept:60",
    ]
    # Kept points the default caught moved into partitions made for them, and the coming partitions exist.
    assert result.moved_rows == 3
    for resolution in KEEP:
        assert where(f"kept:{resolution}") == partitions.partition_name(
            resolution, partitions.period_start(resolution, now - KEEP[resolution] + 60)
        )
        upcoming = partitions.period_start(resolution, now) + partitions.PERIOD[resolution]
        assert partitions.partition_name(resolution, upcoming) in result.created
    # Idempotent: a second run finds nothing to do.
    again = services.prune(now)
    assert (again.created, again.dropped, again.moved_rows) == ([], [], 0)


def test_retention_follows_settings(settings: object) -> None:
    settings.HISTORY_KEEP_10S_HOURS = 1.0  # type: ignore[attr-defined]
    now = time.time()
    put(10, "h:0", now - 3 * 3600)
    put(10, "h:1", now - 60)
    services.prune(now)
    assert list(MetricRollup.objects.values_list("subject", flat=True)) == ["h:1"]


def test_a_point_is_kept_at_most_one_period_past_retention() -> None:
    # A partition whose range is only partly past the cutoff is kept whole.
    now = float(partitions.period_start(10, time.time()) + 1800)
    put(10, "straddling", now - KEEP[10] - 60)  # in the hour that ends 30 min after the cutoff
    partitions.create_partition(10, partitions.period_start(10, now - KEEP[10] - 60))
    services.prune(now)
    assert MetricRollup.objects.filter(subject="straddling").exists()
    services.prune(now + 1800)  # once the whole hour is past retention, it goes
    assert not MetricRollup.objects.filter(subject="straddling").exists()


def _partition_with_a_point(resolution: int, ts: float, subject: str) -> str:
    start = partitions.period_start(resolution, ts)
    partitions.create_partition(resolution, start)
    put(resolution, subject, ts)
    return partitions.partition_name(resolution, start)


def test_over_the_disk_budget_the_oldest_finest_partitions_go_first(settings: object) -> None:
    now = time.time()
    # 10 s points of 2 to 5 hours ago (inside their 24 h retention, past the 1 h floor), one 1 min
    # point of two days ago (inside 7 days, past its 24 h floor), and points inside every floor.
    old_10s = [_partition_with_a_point(10, now - h * 3600, f"10s-{h}h") for h in (5, 4, 3, 2)]
    old_1min = _partition_with_a_point(60, now - 2 * 86400, "1min-2d")
    put(10, "10s-now", now - 60)
    put(60, "1min-now", now - 3600)

    # A first run settles what maintenance creates or moves (rows other tests left in the default
    # partition get their partition), so that the sizes read next are the ones the budget run sees.
    services.prune(now)
    listed = pg_partitions.sizes(partitions.TABLE)
    sizes = {name: size for name, _, size in listed}
    total = sum(sizes.values())
    # Room is kept for the next hour's points: the biggest hour of 10 s points, a sixth of the biggest
    # 6 hours of 1 min points (and a tenth of a day of 1 h points).
    headroom = partitions.hourly_growth(
        [(int(name.split("_r")[1].split("_")[0]), size) for name, _, size in listed if "_r" in name]
    )
    assert headroom >= max(size for name, size in sizes.items() if "_r10_" in name)
    # A budget that one partition's drop meets: the oldest 10 s one goes, and nothing else.
    settings.HISTORY_MAX_GB = (total - sizes[old_10s[0]] + headroom) / 1e9  # type: ignore[attr-defined]
    result = services.prune(now)
    assert result.dropped_for_size == [old_10s[0]] and result.headroom_bytes == headroom
    assert result.bytes_before == total
    assert result.bytes_after + headroom <= settings.HISTORY_MAX_GB * 1e9  # type: ignore[attr-defined]
    assert not MetricRollup.objects.filter(subject="10s-5h").exists()
    assert MetricRollup.objects.filter(subject="10s-4h").exists()

    # No budget at all: every 10 s partition past the floor goes before the 1 min one, and what is
    # inside the floors stays.
    settings.HISTORY_MAX_GB = 0.0  # type: ignore[attr-defined]
    result = services.prune(now)
    assert result.dropped_for_size[:3] == old_10s[1:] and old_1min in result.dropped_for_size
    assert sorted(MetricRollup.objects.values_list("subject", flat=True)) == ["10s-now", "1min-now"]


def test_within_the_budget_nothing_is_dropped_for_size() -> None:
    now = time.time()
    _partition_with_a_point(10, now - 5 * 3600, "10s-5h")
    result = services.prune(now)  # the default budget, 5 GB
    assert result.dropped_for_size == [] and 0 < result.bytes_after == result.bytes_before
    assert MetricRollup.objects.filter(subject="10s-5h").exists()
