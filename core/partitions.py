"""PostgreSQL range partitions for append-only tables whose retention drops whole partitions.

The request log (routing/services.py, one partition per UTC day) and the charts' history
(routing/rollups/partitions.py, per resolution and period) both keep a DEFAULT partition, so an insert
never fails for want of a partition, and create their coming partitions ahead of time. These helpers
are what both do the same way: list what is attached, create a partition and move into it what the
default caught for its range, drop one. Every DDL step waits at most LOCK_TIMEOUT for its lock, so a
long query on the table makes the step fail (retried next run) instead of queueing every insert behind
the waiting DDL.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from django.db import connection, transaction

LOCK_TIMEOUT = "3s"


def is_partitioned(table: str) -> bool:
    """True when `table` is a partitioned PostgreSQL table (never on SQLite)."""
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid "
            "WHERE c.oid = to_regclass(%s)",
            [table],
        )
        return cursor.fetchone() is not None


def attached(cursor: Any, table: str) -> set[str]:
    """The names of the partitions attached to `table`."""
    cursor.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = to_regclass(%s)",
        [table],
    )
    return {row[0] for row in cursor.fetchall()}


def sizes(table: str) -> list[tuple[str, int | None, int]]:
    """(name, row estimate or None before the first ANALYZE, total bytes) of each partition."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, c.reltuples::bigint, pg_total_relation_size(c.oid) "
            "FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s)",
            [table],
        )
        return [(name, None if rows < 0 else rows, size) for name, rows, size in cursor.fetchall()]


@contextlib.contextmanager
def maintenance_lock(key: int) -> Iterator[bool]:
    """PostgreSQL's session advisory lock `key`, tried once: yields whether this process holds it (and
    frees it at the end). A maintenance that finds it held returns: another process is doing its work."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
        held = bool(cursor.fetchone()[0])
    try:
        yield held
    finally:
        if held:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [key])


def set_lock_timeout(cursor: Any) -> None:
    cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")


def ensure_default(cursor: Any, table: str) -> None:
    if f"{table}_default" not in attached(cursor, table):
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {table}_default PARTITION OF {table} DEFAULT")


def create_range_partition(table: str, name: str, bounds: str, predicate: str) -> tuple[bool, int]:
    """Create partition `name` of `table` unless it is attached; returns (created, rows moved into it).

    `bounds` is the partition's `FROM (...) TO (...)` clause and `predicate` the same range as a SQL
    condition on the key columns (values written out: it becomes a CHECK constraint). Rows the default
    partition already holds for that range are moved in the same transaction: PostgreSQL refuses to
    attach a partition whose range has rows in the default. The partition is built as a plain table and
    then ATTACHed, which takes only SHARE UPDATE EXCLUSIVE on the parent (inserts and queries carry on)
    and ACCESS EXCLUSIVE on the default partition for the move and its check; CREATE TABLE ...
    PARTITION OF would lock the whole parent.
    """
    default = f"{table}_default"
    with transaction.atomic(), connection.cursor() as cursor:
        if name in attached(cursor, table):
            return False, 0
        set_lock_timeout(cursor)
        # Locked first so that no row for this range can land in the default between move and attach.
        cursor.execute(f"LOCK TABLE {default} IN ACCESS EXCLUSIVE MODE")
        if name in attached(cursor, table):  # another process won the race (no lock shared)
            return False, 0
        cursor.execute(f"DROP TABLE IF EXISTS {name}")  # a leftover that never got attached
        cursor.execute(f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
        # Lets ATTACH skip scanning the new table for rows outside the range.
        cursor.execute(f"ALTER TABLE {name} ADD CONSTRAINT {name}_range CHECK ({predicate})")
        cursor.execute(
            f"WITH moved AS (DELETE FROM {default} WHERE {predicate} RETURNING *) "
            f"INSERT INTO {name} SELECT * FROM moved"
        )
        moved = cursor.rowcount
        cursor.execute(f"ALTER TABLE {table} ATTACH PARTITION {name} FOR VALUES {bounds}")
        cursor.execute(f"ALTER TABLE {name} DROP CONSTRAINT {name}_range")
        if moved:
            cursor.execute(f"ANALYZE {name}")
        return True, moved


def drop_partition(name: str) -> None:
    """Drop one partition (a catalog change, not a DELETE of its rows); raises DatabaseError on the lock
    timeout."""
    with transaction.atomic(), connection.cursor() as cursor:
        set_lock_timeout(cursor)
        cursor.execute(f"DROP TABLE {name}")
