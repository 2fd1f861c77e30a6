"""Request log: indexes for the explorer's lookups by request id and by API key.

`reqlog_request_id` (request_id) answers "find this request" with one index probe per day partition;
`reqlog_key_created` (key_prefix, created_at) serves the key filter newest first, like the other
(column, created_at) indexes.

On PostgreSQL the table is partitioned (migration 0003), where `CREATE INDEX CONCURRENTLY` is refused
and a plain `CREATE INDEX` on the parent holds a SHARE lock on every partition while it builds: the
proxy's request-log inserts would wait that long. So the index is made the way PostgreSQL documents for
partitioned tables: an (invalid) index `ON ONLY` the parent, then per partition
`CREATE INDEX CONCURRENTLY` (inserts carry on) and `ALTER INDEX ... ATTACH PARTITION`; once every
partition's index is attached, the parent's becomes valid. Partitions attached later
(core/partitions.py) get the index from the parent automatically. Concurrent builds cannot run in a
transaction, hence `atomic = False`; every step is idempotent, so a run that stopped half-way is
finished by running it again (an invalid index left by a failed concurrent build is dropped and built
again).

SQLite (the zero-setup demo, a plain table) gets ordinary indexes.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

TABLE = "routing_requestlog"
INDEXES = (
    models.Index(fields=["request_id"], name="reqlog_request_id"),
    models.Index(fields=["key_prefix", "created_at"], name="reqlog_key_created"),
)


def _is_partitioned(cursor: Any) -> bool:
    cursor.execute(
        "SELECT 1 FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid "
        "WHERE c.oid = to_regclass(%s)",
        [TABLE],
    )
    return cursor.fetchone() is not None


def _partitions(cursor: Any) -> list[str]:
    cursor.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = to_regclass(%s) ORDER BY c.relname",
        [TABLE],
    )
    return [row[0] for row in cursor.fetchall()]


def _attached_to(cursor: Any, parent_index: str) -> set[str]:
    """Partitions whose index is already attached to `parent_index`."""
    cursor.execute(
        "SELECT t.relname FROM pg_inherits i JOIN pg_index x ON x.indexrelid = i.inhrelid "
        "JOIN pg_class t ON t.oid = x.indrelid WHERE i.inhparent = to_regclass(%s)",
        [parent_index],
    )
    return {row[0] for row in cursor.fetchall()}


def _valid(cursor: Any, index: str) -> bool | None:
    """True/False for an existing index's validity; None when there is no such index."""
    cursor.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [index])
    row = cursor.fetchone()
    return None if row is None else bool(row[0])


def _columns(index: models.Index) -> str:
    return ", ".join(f'"{name}"' for name in index.fields)


def _build_partitioned(schema_editor: Any, index: models.Index) -> None:
    run = schema_editor.execute
    name, columns = index.name, _columns(index)
    with schema_editor.connection.cursor() as cursor:
        run(f'CREATE INDEX IF NOT EXISTS "{name}" ON ONLY "{TABLE}" ({columns})')
        # A partition attached while this runs gets its index from the parent; the loop picks up the rest.
        while _valid(cursor, name) is False:
            done = _attached_to(cursor, name)
            todo = [p for p in _partitions(cursor) if p not in done]
            if not todo:
                break
            for part in todo:
                child = f"{part}_{name}"[:63]
                if _valid(cursor, child) is False:  # left by a concurrent build that failed
                    run(f'DROP INDEX CONCURRENTLY IF EXISTS "{child}"')
                run(f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{child}" ON "{part}" ({columns})')
                run(f'ALTER INDEX "{name}" ATTACH PARTITION "{child}"')


def add_indexes(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("routing", "RequestLog")
    if schema_editor.connection.vendor != "postgresql":
        for index in INDEXES:
            schema_editor.add_index(model, index)
        return
    with schema_editor.connection.cursor() as cursor:
        partitioned = _is_partitioned(cursor)
    for index in INDEXES:
        if partitioned:
            _build_partitioned(schema_editor, index)
        else:
            schema_editor.execute(
                f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{index.name}" ON "{TABLE}" ({_columns(index)})'
            )


def drop_indexes(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("routing", "RequestLog")
    if schema_editor.connection.vendor != "postgresql":
        for index in INDEXES:
            schema_editor.remove_index(model, index)
        return
    for index in INDEXES:
        # Dropping the parent's index drops the partitions' indexes attached to it.
        schema_editor.execute(f'DROP INDEX IF EXISTS "{index.name}"')


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("routing", "0014_metric_rollups_partitioned"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="requestlog", index=index) for index in INDEXES],
            database_operations=[migrations.RunPython(add_indexes, drop_indexes, elidable=False)],
        ),
    ]
