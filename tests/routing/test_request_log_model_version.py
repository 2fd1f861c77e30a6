"""The request log's `model_version_id` (migration 0004): on every partition of the PostgreSQL table,
written by the proxy's batch writer, kept when a day's rows move out of the default partition; and on
SQLite's plain table."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from routing.models import RequestLog
from routing.proxy.requestlog import write_rows
from routing.services import create_request_log_partition, partition_name

ROOT = Path(__file__).resolve().parents[2]


def today() -> dt.date:
    # Read at each use, not at import: a suite that runs past midnight UTC must not test against yesterday.
    return dt.datetime.now(dt.UTC).date()


def far_day() -> dt.date:
    return today() + dt.timedelta(days=20)  # no partition yet: its rows land in the default one


def _row(request_id: str, day: dt.date, version: int | None) -> dict[str, object]:
    return {
        "created_at": dt.datetime.combine(day, dt.time(12), tzinfo=dt.UTC),
        "request_id": request_id,
        "status": 200,
        "alias": "m",
        "deployment_id": 3,
        "model_version_id": version,
    }


@pytest.mark.django_db(transaction=True)
def test_every_partition_has_the_column_and_moved_rows_keep_it() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'routing_requestlog'::regclass"
        )
        partitions = [r[0] for r in cursor.fetchall()]
        cursor.execute(
            "SELECT table_name FROM information_schema.columns "
            "WHERE column_name = 'model_version_id' AND data_type = 'bigint'"
        )
        with_column = {r[0] for r in cursor.fetchall()}
    assert "routing_requestlog_default" in partitions and partition_name(today()) in partitions
    assert set(partitions) | {"routing_requestlog"} <= with_column

    write_rows([_row("today", today(), 41), _row("later", far_day(), 42), _row("static", today(), None)])
    got = dict(RequestLog.objects.values_list("request_id", "model_version_id"))
    assert got == {"today": 41, "later": 42, "static": None}
    try:
        created, moved = create_request_log_partition(far_day())
        assert created and moved == 1
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT tableoid::regclass::text, model_version_id FROM routing_requestlog "
                "WHERE request_id = 'later'"
            )
            assert cursor.fetchone() == (partition_name(far_day()), 42)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {partition_name(far_day())}")


WRITE_AND_READ = """
import datetime as dt
from routing.models import RequestLog
from routing.proxy.requestlog import write_rows
write_rows([{"created_at": dt.datetime.now(dt.UTC), "request_id": "r", "status": 200, "model_version_id": 7}])
print(list(RequestLog.objects.values_list("request_id", "model_version_id")))
"""


@pytest.mark.slow
def test_sqlite_has_the_column(tmp_path: Path) -> None:
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}"}
    for args in (["migrate", "--verbosity", "0"], ["shell", "-c", WRITE_AND_READ]):
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[('r', 7)]"
