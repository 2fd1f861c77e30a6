"""On PostgreSQL the request log is partitioned by UTC day; maintenance creates, fills and drops days."""

from __future__ import annotations

import datetime as dt
import io

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from pytest_django.fixtures import Settings

from routing.models import RequestLog
from routing.services import (
    DEFAULT_PARTITION,
    maintain_request_log,
    partition_name,
    request_log_is_partitioned,
    request_log_partitions,
)

pytestmark = pytest.mark.django_db


def today() -> dt.date:
    # Read at each use, not at import: a suite that runs past midnight UTC must not test against yesterday.
    return dt.datetime.now(dt.UTC).date()


def at(day: dt.date, hour: int = 12) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(hour), tzinfo=dt.UTC)


def days_ago(n: int) -> dt.date:
    return today() - dt.timedelta(days=n)


def partition_of(row_id: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text FROM routing_requestlog WHERE id = %s", [row_id])
        return cursor.fetchone()[0]


def day_partitions() -> set[dt.date]:
    return {p.day for p in request_log_partitions() if p.day is not None}


def test_table_is_partitioned_with_composite_primary_key_and_indexes_per_partition() -> None:
    assert request_log_is_partitioned()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = 'routing_requestlog'::regclass AND contype = 'p'"
        )
        assert cursor.fetchone()[0] == "PRIMARY KEY (id, created_at)"
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE tablename = %s", [partition_name(today())])
        defs = sorted(d.split(" USING btree ")[1] for (d,) in cursor.fetchall())
    assert defs == [
        "(alias, created_at)",
        "(created_at)",
        "(id, created_at)",
        "(key_prefix, created_at)",
        "(request_id)",
        "(status, created_at)",
        "(tenant_id, created_at)",
    ]
    # The migration made its day's partition and the three ahead, plus the default (range(3): the test
    # database may have been migrated before midnight UTC).
    assert {today() + dt.timedelta(days=n) for n in range(3)} <= day_partitions()
    assert DEFAULT_PARTITION in {p.name for p in request_log_partitions()}


def test_rows_land_in_their_day_partition() -> None:
    day = today()
    midnight_row = RequestLog.objects.create(created_at=at(day, 0), status=200)
    tomorrow_midnight = RequestLog.objects.create(created_at=at(day + dt.timedelta(days=1), 0), status=200)
    just_before = RequestLog.objects.create(
        created_at=at(day + dt.timedelta(days=1), 0) - dt.timedelta(microseconds=1), status=200
    )
    assert partition_of(midnight_row.pk) == partition_name(day)
    assert partition_of(tomorrow_midnight.pk) == partition_name(day + dt.timedelta(days=1))
    assert partition_of(just_before.pk) == partition_name(day)
    # Ids still come from one sequence and Django addresses rows by id alone.
    assert RequestLog.objects.get(pk=just_before.pk).created_at == just_before.created_at


def test_row_without_partition_goes_to_default_and_moves_when_its_day_is_created() -> None:
    old = RequestLog.objects.create(created_at=at(days_ago(5)), status=500, alias="m")
    other = RequestLog.objects.create(created_at=at(days_ago(5), 23), status=200, alias="m")
    assert partition_of(old.pk) == partition_of(other.pk) == DEFAULT_PARTITION
    done = maintain_request_log(retention_days=30)
    assert partition_name(days_ago(5)) in done.created
    assert done.moved_rows == 2
    assert partition_of(old.pk) == partition_of(other.pk) == partition_name(days_ago(5))
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {DEFAULT_PARTITION}")
        assert cursor.fetchone()[0] == 0
    assert RequestLog.objects.get(pk=old.pk).status == 500


def test_retention_drops_exactly_the_days_past_the_cutoff() -> None:
    for n in (40, 31, 30, 29, 1):
        RequestLog.objects.create(created_at=at(days_ago(n)), status=200)
    maintain_request_log(retention_days=60)  # every day gets its partition, nothing dropped yet
    assert {days_ago(n) for n in (40, 31, 30, 29, 1)} <= day_partitions()
    # A row older than every partition stays in the default until retention catches it.
    stale = RequestLog.objects.create(created_at=at(days_ago(90)), status=200)
    assert partition_of(stale.pk) == DEFAULT_PARTITION

    done = maintain_request_log(retention_days=30)
    assert sorted(done.dropped) == [partition_name(days_ago(40)), partition_name(days_ago(31))]
    assert done.deleted_rows == 1
    kept = sorted((today() - r.created_at.date()).days for r in RequestLog.objects.all())
    assert kept == [1, 29, 30]
    assert not {days_ago(40), days_ago(31)} & day_partitions()
    assert {days_ago(30), days_ago(29)} <= day_partitions()


def test_partitions_ahead_follow_the_setting(settings: Settings) -> None:
    settings.REQUEST_LOG_PARTITIONS_AHEAD = 6
    done = maintain_request_log(retention_days=30)
    ahead = [partition_name(today() + dt.timedelta(days=n)) for n in (3, 4, 5, 6)]
    # Days 1-3 were made by the migration; day 3 too when it ran before midnight UTC.
    assert set(ahead[1:]) <= set(done.created) <= set(ahead)
    row = RequestLog.objects.create(created_at=at(today() + dt.timedelta(days=6)), status=200)
    assert partition_of(row.pk) == partition_name(today() + dt.timedelta(days=6))


def test_running_maintenance_twice_changes_nothing_the_second_time() -> None:
    RequestLog.objects.create(created_at=at(days_ago(3)), status=200)
    RequestLog.objects.create(created_at=at(days_ago(45)), status=200)
    first = maintain_request_log(retention_days=30)
    assert first.created and first.moved_rows == 1 and first.deleted_rows == 1
    parts = request_log_partitions()
    second = maintain_request_log(retention_days=30)
    assert (second.created, second.moved_rows, second.dropped, second.deleted_rows, second.failed) == (
        [],
        0,
        [],
        0,
        [],
    )
    assert [p.name for p in request_log_partitions()] == [p.name for p in parts]
    assert RequestLog.objects.count() == 1


def test_management_command_maintains_and_lists_partitions() -> None:
    RequestLog.objects.create(created_at=at(days_ago(6)), status=200)
    out = io.StringIO()
    call_command("request_log_partitions", "--show", stdout=out)
    assert partition_name(days_ago(6)) not in out.getvalue()  # --show changes nothing
    # The coming days' partitions exist since the migrations ran, unless the suite has crossed midnight
    # UTC since then: those the run will add too are counted, so the test holds at any hour.
    coming = {today() + dt.timedelta(days=n) for n in range(settings.REQUEST_LOG_PARTITIONS_AHEAD + 1)}
    created = 1 + len(coming - day_partitions())
    call_command("request_log_partitions", stdout=out)
    listed = out.getvalue()
    assert f"created {created} partitions (1 rows moved from the default)" in listed
    assert partition_name(days_ago(6)) in listed and partition_name(today()) in listed
    assert DEFAULT_PARTITION in listed
