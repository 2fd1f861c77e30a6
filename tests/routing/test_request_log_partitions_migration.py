"""Migration 0003 turns a request log holding rows into the partitioned table and back, losing none."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from routing.models import RequestLog
from routing.services import DEFAULT_PARTITION, partition_name, request_log_is_partitioned

pytestmark = pytest.mark.django_db(transaction=True)


def today() -> dt.date:
    # Read at each use, not at import: a suite that runs past midnight UTC must not test against yesterday.
    return dt.datetime.now(dt.UTC).date()


def migrate(target: str) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate([("routing", target)])


def latest() -> str:
    """The last routing migration (later ones, such as 0004's column, run on the partitioned table)."""
    [(_, name)] = MigrationExecutor(connection).loader.graph.leaf_nodes("routing")
    return name


@pytest.fixture
def back_to_latest() -> Iterator[None]:
    yield
    # Every app's latest, not only routing's: going back to routing 0002 also unapplies other apps'
    # migrations that depend on later routing ones (nodes 0007's scaling policy names a pool), and the
    # tests after this one need all of them (they failed on nodes 0008's column when only routing came back).
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    with connection.cursor() as cursor:  # the test's extra day, so other tests find the usual partitions
        cursor.execute(f"DROP TABLE IF EXISTS {partition_name(today() - dt.timedelta(days=4))}")


def insert(days_ago: int, request_id: str) -> None:
    created = dt.datetime.combine(today() - dt.timedelta(days=days_ago), dt.time(9), tzinfo=dt.UTC)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO routing_requestlog (created_at, request_id, tenant_id, tenant_name, key_prefix, "
            "endpoint_kind, alias, upstream, status, error_type, stream, priority, prompt_tokens_estimated, "
            "retries, route_pool, route_reason) "
            "VALUES (%s, %s, 7, 't', 'k', 'chat', 'm', 'u', 200, '', false, '', false, 0, 'p', 'r')",
            [created, request_id],
        )


def where(request_id: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tableoid::regclass::text FROM routing_requestlog WHERE request_id = %s", [request_id]
        )
        return cursor.fetchone()[0]


def test_rows_survive_both_directions(back_to_latest: None) -> None:
    insert(0, "before-down")
    migrate("0002_route_pool_batch_max_fraction")
    assert not request_log_is_partitioned()
    assert where("before-down") == "routing_requestlog"
    for days_ago, rid in ((0, "today"), (4, "four-days"), (45, "past-retention")):
        insert(days_ago, rid)
    ids = dict(RequestLog.objects.values_list("request_id", "id"))

    migrate(latest())

    assert request_log_is_partitioned()
    assert dict(RequestLog.objects.values_list("request_id", "id")) == ids
    assert where("today") == where("before-down") == partition_name(today())
    # Days inside retention that held rows got their partition; older rows wait in the default.
    assert where("four-days") == partition_name(today() - dt.timedelta(days=4))
    assert where("past-retention") == DEFAULT_PARTITION
    # The id sequence continues after the copied rows.
    assert RequestLog.objects.create(status=200).pk > max(ids.values())
