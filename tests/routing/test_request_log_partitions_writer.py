"""The proxy's request-log writer inserts into the partitioned table through its real flush path."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path

import orjson
from django.db import connection

from routing.models import RequestLog
from routing.proxy.requestlog import RequestLogWriter
from routing.services import DEFAULT_PARTITION, maintain_request_log, partition_name, request_log_partitions


def today() -> dt.date:
    # Read at each use, not at import: a suite that runs past midnight UTC must not test against yesterday.
    return dt.datetime.now(dt.UTC).date()


def partition_of(request_id: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tableoid::regclass::text FROM routing_requestlog WHERE request_id = %s", [request_id]
        )
        return cursor.fetchone()[0]


def test_writer_rows_land_in_day_and_default_partitions(tmp_path: Path, transactional_db: None) -> None:
    old_day = today() - dt.timedelta(days=8)
    # A batch spooled during an outage a week ago, replayed by the next flush (created_at as ISO text).
    spooled = {"request_id": "spooled", "status": 502, "created_at": f"{old_day.isoformat()}T10:00:00+00:00"}
    tmp_path.joinpath("1-1-a.jsonl").write_bytes(orjson.dumps(spooled) + b"\n")

    async def run() -> None:
        writer = RequestLogWriter(tmp_path)
        writer.add({"request_id": "now", "status": 200, "alias": "m", "tenant_name": "t"})
        await writer.close()

    day_before = today()
    asyncio.run(run())
    days = {partition_name(day_before), partition_name(today())}  # the write may straddle midnight UTC
    assert list(tmp_path.glob("*")) == []  # nothing left spooled: every row was written
    assert partition_of("now") in days
    assert partition_of("spooled") == DEFAULT_PARTITION
    try:
        assert maintain_request_log(retention_days=30).moved_rows == 1
        assert partition_of("spooled") == partition_name(old_day)
        assert RequestLog.objects.count() == 2
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {partition_name(old_day)}")
    assert partition_name(old_day) not in {p.name for p in request_log_partitions()}
