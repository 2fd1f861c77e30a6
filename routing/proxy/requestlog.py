"""Request-log rows written in batches off the hot path; spooled to disk while the database is down.

The proxy only appends a dict to a list per request. A background task hands each batch to one
dedicated thread (so the ORM's connection stays on that thread), which writes it with one
INSERT ... SELECT from a JSON document on PostgreSQL (one executemany elsewhere).
When the insert fails, the batch goes to a JSON-lines spool file, and every later successful flush
first replays the spool, so rows are delayed by an outage, never lost, and never fail a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
from django.db import connection, transaction

from console.models import ApiKey
from routing.models import RequestLog
from routing.proxy.metrics import REQUEST_LOG_SPOOLED

log = logging.getLogger(__name__)


COLUMNS = (
    "created_at",
    "request_id",
    "tenant_id",
    "tenant_name",
    "key_prefix",
    "endpoint_kind",
    "alias",
    "deployment_id",
    "model_version_id",
    "upstream",
    "status",
    "error_type",
    "stream",
    "priority",
    "prompt_tokens",
    "prompt_tokens_estimated",
    "completion_tokens",
    "ttft_ms",
    "latency_ms",
    "retries",
    "route_pool",
    "route_reason",
    "prompt_text",
    "response_text",
    "stages",
)
# Column defaults for rows that omit a field (spooled rows from older versions, tests).
DEFAULTS: dict[str, Any] = {
    "request_id": "",
    "tenant_name": "",
    "key_prefix": "",
    "endpoint_kind": "",
    "alias": "",
    "upstream": "",
    "error_type": "",
    "stream": False,
    "priority": "",
    "prompt_tokens_estimated": False,
    "retries": 0,
    "route_pool": "",
    "route_reason": "",
}


_COMPLETE = frozenset(COLUMNS)
_STAGES_AT = COLUMNS.index("stages")


def _without_nul(row: dict[str, Any]) -> dict[str, Any]:
    # PostgreSQL text cannot hold NUL; one in a client's model name or prompt must not make the whole
    # batch fail (and then fail again from the spool, forever).
    return {k: v.replace("\x00", "\ufffd") if isinstance(v, str) else v for k, v in row.items()}


def write_rows(rows: list[dict[str, Any]]) -> None:
    """Insert rows and stamp their keys' last_used_at (sync; raises on a database error).

    On PostgreSQL the batch is one JSON document (orjson, in C) expanded by the server with
    `json_populate_recordset` in one INSERT ... SELECT, so the proxy process spends about a
    microsecond per row and the per-row work runs in PostgreSQL; psycopg's COPY, the earlier way,
    cost the proxy's thread about 15 us per row in Python. Elsewhere one executemany of a fixed
    INSERT. Never bulk_create: building model instances cost about a third of the proxy's CPU at a
    thousand requests per second.
    """
    ops = connection.ops
    table = ops.quote_name(RequestLog._meta.db_table)
    columns = ", ".join(ops.quote_name(c) for c in COLUMNS)
    now = dt.datetime.now(dt.UTC)
    key_ids = {key_id for row in rows if (key_id := row.get("key_id")) is not None}
    # The proxy's rows carry every column; rows from elsewhere (old spool files, tests) get defaults.
    full = [
        row
        if row.keys() >= _COMPLETE and row["created_at"]
        else {**DEFAULTS, **row, "created_at": row.get("created_at") or now}
        for row in rows
    ]
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            payload = orjson.dumps(full, default=str)
            if b"\\u0000" in payload:
                payload = orjson.dumps([_without_nul(row) for row in full], default=str)
            # Through the partitioned parent table like any INSERT; keys that are not columns (key_id)
            # are ignored by json_populate_recordset.
            cursor.execute(
                f"INSERT INTO {table} ({columns}) SELECT {columns} "
                f"FROM json_populate_recordset(NULL::{table}, %s::json)",
                [payload.decode()],
            )
        else:
            params = []
            for row in full:
                created = row["created_at"]
                if isinstance(created, str):
                    created = dt.datetime.fromisoformat(created)
                values = [ops.adapt_datetimefield_value(created), *(row.get(c) for c in COLUMNS[1:])]
                if values[_STAGES_AT] is not None:  # a JSON column holds text here
                    values[_STAGES_AT] = orjson.dumps(values[_STAGES_AT]).decode()
                params.append(values)
            cursor.executemany(
                f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * len(COLUMNS))})", params
            )
        if key_ids:
            ApiKey.objects.filter(pk__in=key_ids).update(last_used_at=now)


def _close_connection() -> None:
    """The writer thread's own database connection, closed when the writer stops."""
    connection.close()


class RequestLogWriter:
    """Collects rows from the event loop and writes them in batches from one thread."""

    def __init__(
        self,
        spool_dir: Path,
        *,
        flush_interval_s: float = 0.5,
        batch_size: int = 500,
        writer: Any = None,
        label: str = "request log",
        spooled_counter: Any = REQUEST_LOG_SPOOLED,
    ) -> None:
        # Another table's rows (shadow pairs) may use the same batching and spool: `writer`, `label`
        # (for the log) and the counter of spooled rows (None: not counted).
        self.label = label
        self.spooled_counter = spooled_counter
        self.spool_dir = spool_dir
        self.flush_interval_s = flush_interval_s
        self.batch_size = batch_size
        self.buffer: list[dict[str, Any]] = []
        self.write = writer or write_rows
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="request-log")
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def add(self, row: dict[str, Any]) -> None:
        self.buffer.append(row)
        if len(self.buffer) >= self.batch_size:
            self._wake.set()

    def start(self, maintain: Callable[[], Any] | None = None) -> None:
        """Start flushing; `maintain` (the request log's partition upkeep) runs first, on the writer's
        thread, so the day partitions exist before the first batch and the event loop never waits."""
        if maintain is not None:
            self._executor.submit(self._maintain_sync, maintain)
        self._task = asyncio.get_running_loop().create_task(self._run())

    @staticmethod
    def _maintain_sync(maintain: Callable[[], Any]) -> None:
        try:
            maintain()
        except Exception as exc:  # the hourly task retries; rows land in the default partition meanwhile
            log.warning("request log: partition upkeep at start failed (%s)", exc)

    async def _run(self) -> None:
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.flush_interval_s)
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        rows, self.buffer = self.buffer, []
        if not rows and not self._has_spool():
            return
        await asyncio.get_running_loop().run_in_executor(self._executor, self._flush_sync, rows)

    async def close(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await self._task
        await self.flush()
        await asyncio.get_running_loop().run_in_executor(self._executor, _close_connection)
        self._executor.shutdown(wait=True)

    def _has_spool(self) -> bool:
        try:
            return any(self.spool_dir.glob("*.jsonl"))
        except OSError:
            return False

    def _flush_sync(self, rows: list[dict[str, Any]]) -> None:
        # One connection for the life of this thread, not one per batch (close_old_connections would
        # reconnect on every flush with CONN_MAX_AGE=0): a cheap liveness check instead, and after a
        # failure it is closed below so that the next batch connects afresh.
        if connection.connection is not None and not connection.is_usable():
            connection.close()
        try:
            self._replay_spool()
            if rows:
                self.write(rows)
        except Exception as exc:  # any database failure: keep the rows on disk and carry on serving
            log.warning("%s: database write failed (%s); spooling %d rows", self.label, exc, len(rows))
            connection.close()
            if rows:
                self._spool(rows)

    def _spool(self, rows: list[dict[str, Any]]) -> None:
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        name = f"{time.time_ns()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
        tmp = self.spool_dir / (name + ".tmp")
        with tmp.open("wb") as fh:
            for row in rows:
                fh.write(orjson.dumps(row, default=str) + b"\n")
        # Rename so a replay never sees a half-written file.
        tmp.rename(self.spool_dir / name)
        if self.spooled_counter is not None:
            self.spooled_counter.inc(len(rows))

    def _replay_spool(self) -> None:
        if not self.spool_dir.exists():
            return
        for path in sorted(self.spool_dir.glob("*.jsonl")):
            claimed = path.with_suffix(f".{os.getpid()}.replaying")
            try:
                path.rename(claimed)  # another process may be replaying the same file
            except OSError:
                continue
            rows = [orjson.loads(line) for line in claimed.read_bytes().splitlines() if line.strip()]
            try:
                self.write(rows)
            except Exception:
                claimed.rename(path)
                raise
            claimed.unlink()
