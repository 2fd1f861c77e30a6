"""Request-log maintenance from several processes at once is harmless, and its DDL never queues inserts."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection, connections

from core import partitions
from routing.models import RequestLog
from routing.services import (
    DEFAULT_PARTITION,
    create_request_log_partition,
    maintain_request_log,
    partition_name,
    request_log_partitions,
)

pytestmark = pytest.mark.django_db(transaction=True)


def today() -> dt.date:
    # Read at each use, not at import: a suite that runs past midnight UTC must not test against yesterday.
    return dt.datetime.now(dt.UTC).date()


def at(days_ago: int) -> dt.datetime:
    return dt.datetime.combine(today() - dt.timedelta(days=days_ago), dt.time(12), tzinfo=dt.UTC)


def partition_of(row_id: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text FROM routing_requestlog WHERE id = %s", [row_id])
        return cursor.fetchone()[0]


@pytest.fixture(autouse=True)
def drop_new_partitions() -> Iterator[None]:
    """Transactional tests commit their DDL: put the partitions back as the migration left them."""
    before = {p.name for p in request_log_partitions()}
    yield
    with connection.cursor() as cursor:
        for p in request_log_partitions():
            if p.name not in before:
                cursor.execute(f"DROP TABLE {p.name}")


def in_threads(n: int, fn: Callable[[], Any]) -> list[Any]:
    """Run fn in n threads released together; each uses (and closes) its own database connection."""
    barrier = threading.Barrier(n)
    results: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            barrier.wait()
            results.append(fn())
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]
    return results


def test_concurrent_maintenance_moves_each_row_once() -> None:
    rows = [RequestLog.objects.create(created_at=at(n), status=200) for n in (11, 12, 12)]
    results = in_threads(3, lambda: maintain_request_log(retention_days=30))
    created = [name for r in results for name in r.created]
    assert sorted(created) == [partition_name(today() - dt.timedelta(days=n)) for n in (12, 11)]
    assert sum(r.moved_rows for r in results) == 3
    assert [partition_of(r.pk) for r in rows] == [
        partition_name(today() - dt.timedelta(days=n)) for n in (11, 12, 12)
    ]
    assert RequestLog.objects.count() == 3


def test_concurrent_creation_of_one_day_creates_it_once() -> None:
    row = RequestLog.objects.create(created_at=at(13), status=200)
    results = in_threads(4, lambda: create_request_log_partition(today() - dt.timedelta(days=13)))
    assert sorted(results) == [(False, 0), (False, 0), (False, 0), (True, 1)]
    assert partition_of(row.pk) == partition_name(today() - dt.timedelta(days=13))


def test_drop_gives_up_on_a_busy_table_instead_of_queueing_inserts(monkeypatch: pytest.MonkeyPatch) -> None:
    RequestLog.objects.create(created_at=at(50), status=200)
    maintain_request_log(retention_days=60)
    expired = partition_name(today() - dt.timedelta(days=50))
    monkeypatch.setattr(partitions, "LOCK_TIMEOUT", "200ms")
    # A long explorer query elsewhere: its transaction holds ACCESS SHARE on the log.
    db = connection.settings_dict
    reader = psycopg.connect(
        dbname=db["NAME"], host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], password=db["PASSWORD"]
    )
    try:
        reader.execute("SELECT count(*) FROM routing_requestlog").fetchone()
        done = maintain_request_log(retention_days=30)
        assert done.failed == [expired] and done.dropped == []
        # Inserts queue behind a waiting DROP for at most LOCK_TIMEOUT; once it gave up they go through.
        RequestLog.objects.create(created_at=at(0), status=200)
    finally:
        reader.close()
    done = maintain_request_log(retention_days=30)
    assert done.dropped == [expired]
    assert DEFAULT_PARTITION in {p.name for p in request_log_partitions()}
