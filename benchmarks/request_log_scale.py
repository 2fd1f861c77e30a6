"""The request log at tens of millions of rows: explorer queries and retention on the partitioned table.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python benchmarks/request_log_scale.py --rows 20000000 --days 30

1. Creates a scratch database on DATABASE_URL's server (dropped at the end unless --keep) and runs
   every migration there, so the table is the one migration 0003 builds.
2. Fills `--days` UTC days ending now with `--rows` rows from generate_series: 200 tenants and 12
   aliases with skewed popularity, ~95% status 200 and a tail of 429/499/500/502/503, token counts,
   latencies, streams. Each day is loaded into a plain table, indexed (the same five indexes the
   partitioned table declares), vacuumed, then ATTACHed as that day's partition; two days at a time.
3. Times the explorer's real requests through the DRF views (the same querysets, filters and cursor
   pagination the console uses), median of `--runs` after one warm-up: first page unfiltered, by
   tenant, by alias, by status, a two-hour time range, a deep cursor page (20 days back) and the
   24-hour usage aggregate of one tenant. EXPLAIN of each one's main query counts the partitions
   the plan reads (plan-time pruning; the default partition is always among them).
4. Retention: `routing.services.maintain_request_log` dropping the oldest day's partition, against
   `routing.services.prune_request_log` deleting the same number of rows (one day) from a plain
   table of `--plain-days` days (smaller than the partitioned one, to keep the run short); wall time
   and WAL written for each.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import functools
import json
import os
import statistics
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCRATCH_DB = "inferchain_request_log_scale"
TABLE = "routing_requestlog"
ALIASES = [
    "llama3-8b",
    "llama3-70b",
    "qwen2-7b",
    "mistral-7b",
    "gemma2-9b",
    "phi3-mini",
    "llama3-8b-awq",
    "qwen2-72b",
    "deepseek-coder",
    "smollm2",
    "embed-small",
    "llama3-70b-fp8",
]
INDEXES = {
    "created": "(created_at)",
    "tenant_created": "(tenant_id, created_at)",
    "alias_created": "(alias, created_at)",
    "status_created": "(status, created_at)",
}

# One row per generate_series value i of a day with n rows starting at day_start; ids are given so
# that days can be loaded in parallel. Popularity skew: random()^3 puts most traffic on low tenant
# ids, random()^2 on the first aliases.
FILL_SQL = """
INSERT INTO {stage} (id, created_at, request_id, tenant_id, tenant_name, key_prefix, endpoint_kind,
    alias, deployment_id, upstream, status, error_type, stream, priority, prompt_tokens,
    prompt_tokens_estimated, completion_tokens, ttft_ms, latency_ms, retries, route_pool,
    route_reason, prompt_text, response_text)
SELECT %(id0)s + i, t, md5(i::text || %(day)s), tenant, 'tenant-' || tenant,
    'ic_' || lpad(tenant::text, 5, '0'),
    CASE WHEN alias = 'embed-small' THEN 'embeddings' ELSE 'chat.completions' END,
    alias, 1 + (tenant * 7 + i) %% 40, 'http://10.0.' || ((tenant * 7 + i) %% 40) || '.1:8000', status,
    CASE status WHEN 200 THEN '' WHEN 429 THEN 'rate_limit_exceeded' WHEN 499 THEN 'client_disconnected'
        ELSE 'upstream_error' END,
    stream, CASE WHEN tenant %% 5 = 0 THEN 'batch' ELSE 'interactive' END,
    (20 + r1 * 4000)::int, false, CASE WHEN status = 200 THEN (1 + r2 * 1000)::int END,
    CASE WHEN stream AND status = 200 THEN 40 + r2 * 400 END, 80 + r1 * r2 * 20000,
    (status >= 500)::int, alias || '-pool', 'policy default rule 1; best_fit leftover=' || (r2 * 900)::int,
    NULL, NULL
FROM (
    SELECT i, t, tenant, alias, stream, r1, r2,
        CASE WHEN s < 0.95 THEN 200 WHEN s < 0.975 THEN 429 WHEN s < 0.985 THEN 499
            WHEN s < 0.99 THEN 500 WHEN s < 0.995 THEN 502 ELSE 503 END AS status
    FROM (
        SELECT i, %(start)s::timestamptz + make_interval(secs => (i + random()) * %(span)s / %(n)s) AS t,
            1 + floor(200 * random() ^ 3)::int AS tenant,
            (%(aliases)s::text[])[1 + floor(12 * random() ^ 2)::int] AS alias,
            random() AS s, random() < 0.6 AS stream, random() AS r1, random() AS r2
        FROM generate_series(0, %(n)s - 1) AS i
        OFFSET 0  -- keeps each random() evaluated once per row
    ) AS raw
) AS g
"""


def scratch_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path="/" + SCRATCH_DB))


def median_ms(fn: Callable[[], Any], runs: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def day_plan(days: int, rows: int, now: dt.datetime) -> list[tuple[dt.date, dt.datetime, float, int]]:
    """(day, start, seconds covered, rows) for each day ending now; today holds only the hours so far."""
    today = now.date()
    start_today = dt.datetime.combine(today, dt.time(), tzinfo=dt.UTC)
    spans = [86400.0] * (days - 1) + [(now - start_today).total_seconds()]
    per_second = rows / sum(spans)
    plan = []
    for k, span in enumerate(spans):
        day = today - dt.timedelta(days=days - 1 - k)
        start = dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)
        plan.append((day, start, span, max(1, round(per_second * span))))
    return plan


def load_day(url: str, day: dt.date, start: dt.datetime, span: float, n: int, id0: int) -> dict[str, float]:
    """Fill, index and vacuum one day as a plain table (attached later); returns seconds per phase."""
    stage = f"{TABLE}_p{day:%Y%m%d}"
    t0 = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        conn.execute(f"DROP TABLE IF EXISTS {stage}")
        conn.execute(f"CREATE TABLE {stage} (LIKE {TABLE} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
        conn.execute(
            FILL_SQL.format(stage=stage),
            {"id0": id0, "day": day.isoformat(), "start": start, "span": span, "n": n, "aliases": ALIASES},
        )
        t1 = time.perf_counter()
        conn.execute(f"ALTER TABLE {stage} ADD PRIMARY KEY (id, created_at)")
        for suffix, cols in INDEXES.items():
            conn.execute(f"CREATE INDEX {stage}_{suffix} ON {stage} {cols}")
        lo, hi = start.isoformat(), (start + dt.timedelta(days=1)).isoformat()
        # Lets ATTACH skip scanning the table for rows outside the day.
        conn.execute(
            f"ALTER TABLE {stage} ADD CONSTRAINT {stage}_range "
            f"CHECK (created_at >= '{lo}' AND created_at < '{hi}')"
        )
        t2 = time.perf_counter()
        conn.execute(f"VACUUM (ANALYZE) {stage}")
    t3 = time.perf_counter()
    return {"insert_s": t1 - t0, "index_s": t2 - t1, "vacuum_s": t3 - t2}


def attach_day(url: str, day: dt.date) -> None:
    name = f"{TABLE}_p{day:%Y%m%d}"
    lo = dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)
    hi = lo + dt.timedelta(days=1)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {TABLE} ATTACH PARTITION {name} FOR VALUES FROM ('{lo}') TO ('{hi}')")
        conn.execute(f"ALTER TABLE {name} DROP CONSTRAINT {name}_range")


def fill(url: str, days: int, rows: int, workers: int) -> dict[str, Any]:
    now = dt.datetime.now(dt.UTC)
    plan = day_plan(days, rows, now)
    with psycopg.connect(url, autocommit=True) as conn:
        # The migration made empty partitions for today and the days ahead: today's is replaced.
        for day, *_ in plan:
            conn.execute(f"DROP TABLE IF EXISTS {TABLE}_p{day:%Y%m%d}")
    t0 = time.perf_counter()
    ids = 0
    jobs = []
    with ThreadPoolExecutor(workers) as pool:
        for day, start, span, n in plan:
            jobs.append((day, pool.submit(load_day, url, day, start, span, n, ids)))
            ids += n
        phases: dict[str, float] = {}
        for day, job in jobs:
            for phase, secs in job.result().items():
                phases[phase] = phases.get(phase, 0.0) + secs
            attach_day(url, day)
            print(f"  loaded {day} ({time.perf_counter() - t0:.0f} s)", flush=True)
    print("  worker seconds per phase: " + ", ".join(f"{k} {v:.0f}" for k, v in phases.items()), flush=True)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"SELECT setval(pg_get_serial_sequence('{TABLE}', 'id'), %s)", [ids])
        conn.execute(f"ANALYZE {TABLE}")  # the parent's own statistics over all partitions
        size = scalar(
            conn,
            f"SELECT pg_size_pretty(sum(pg_total_relation_size(inhrelid))) FROM pg_inherits "
            f"WHERE inhparent = '{TABLE}'::regclass",
        )
    return {"rows": ids, "days": days, "fill_s": round(time.perf_counter() - t0, 1), "size": size, "now": now}


def cursor_at(position: dt.datetime) -> str:
    # DRF CursorPagination's encoding: base64 of "p=<position>" (offset 0, forward).
    return base64.b64encode(urllib.parse.urlencode({"p": str(position)}).encode()).decode()


def explain_partitions(sql: str, params: Any) -> tuple[int, int]:
    """(partitions the plan reads, partitions in total) for one query, from EXPLAIN (FORMAT JSON)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
        if isinstance(plan, str):
            plan = json.loads(plan)
        cursor.execute(f"SELECT count(*) FROM pg_inherits WHERE inhparent = '{TABLE}'::regclass")
        total = cursor.fetchone()[0]
    seen: set[str] = set()

    def walk(node: dict[str, Any]) -> None:
        if "Relation Name" in node:
            seen.add(node["Relation Name"])
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    return len(seen), total


def run_sql(sql: str) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql)
        cursor.fetchall()


def time_queries(info: dict[str, Any], runs: int) -> list[dict[str, Any]]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from rest_framework.test import APIClient

    from console.choices import Role
    from console.models import User

    user = User.objects.create(username="bench-admin", role=Role.ADMIN)
    client = APIClient()
    client.force_authenticate(user)
    now: dt.datetime = info["now"]
    # A tenant of middling traffic (about 0.2% of rows) and an alias of middling popularity.
    tenant, alias = 60, ALIASES[5]
    window = now - dt.timedelta(days=10)
    cases = [
        ("first page, unfiltered", "/api/request-log/"),
        ("first page, tenant", f"/api/request-log/?tenant_id={tenant}"),
        ("first page, alias", f"/api/request-log/?alias={alias}"),
        ("first page, status 503", "/api/request-log/?status=503"),
        (
            "time range (2 h, 10 days ago)",
            "/api/request-log/?"
            + urllib.parse.urlencode(
                {"since": (window - dt.timedelta(hours=2)).isoformat(), "until": window.isoformat()}
            ),
        ),
        (
            "deep cursor page (20 days back)",
            f"/api/request-log/?cursor={cursor_at(now - dt.timedelta(days=20))}",
        ),
        ("usage, one tenant, 24 h", f"/api/routing/usage/?tenant_id={tenant}&hours=24"),
    ]
    results = []
    for label, url in cases:

        def call(url: str = url) -> Any:
            response = client.get(url)
            assert response.status_code == 200, (url, response.status_code, response.content[:300])
            return response

        with CaptureQueriesContext(connection) as captured:
            body = call().json()
        main = max(captured.captured_queries, key=lambda q: len(q["sql"]))  # the log query, not auth
        returned = len(body["results"]) if isinstance(body, dict) else len(body)
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT TEXT) {main['sql']}")
            plan_text = "\n".join(r[0] for r in cursor.fetchall())
        read, total = explain_partitions(main["sql"], None)
        ms = median_ms(call, runs)
        sql_ms = median_ms(functools.partial(run_sql, main["sql"]), runs)
        results.append(
            {
                "query": label,
                "request_ms": round(ms, 1),
                "sql_ms": round(sql_ms, 2),
                "returned": returned,
                "partitions": f"{read} of {total}",
                "plan": plan_text,
            }
        )
        print(
            f"  {label}: request {ms:.1f} ms, SQL {sql_ms:.2f} ms, {returned} returned, "
            f"plan reads {read} of {total} partitions",
            flush=True,
        )
        if label.startswith("time range"):
            print("    " + "\n    ".join(plan_text.splitlines()[:12]), flush=True)
    return results


def scalar(conn: psycopg.Connection[Any], sql: str, params: Any = None) -> Any:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def wal_bytes(conn: psycopg.Connection[Any], since: str) -> int:
    return int(scalar(conn, "SELECT pg_current_wal_lsn() - %s::pg_lsn", [since]))


@contextlib.contextmanager
def model_on_table(table: str) -> Iterator[None]:
    """Point routing.services' RequestLog at another table (same columns) for the duration."""
    from django.db import models

    from routing import services

    meta = type("Meta", (), {"db_table": table, "managed": False, "app_label": "routing"})
    fields: dict[str, Any] = {
        "id": models.BigAutoField(primary_key=True),
        "created_at": models.DateTimeField(),
    }
    plain = type("PlainRequestLog", (models.Model,), {"__module__": __name__, "Meta": meta, **fields})
    real = services.RequestLog
    services.RequestLog = plain  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        services.RequestLog = real  # type: ignore[misc]


def retention(url: str, info: dict[str, Any], plain_days: int) -> dict[str, Any]:
    """The real maintenance dropping the oldest day, vs the real batch DELETE of a day in a plain table."""
    from routing.services import maintain_request_log, prune_request_log

    out: dict[str, Any] = {}
    first_day = info["now"].date() - dt.timedelta(days=info["days"] - 1)
    with psycopg.connect(url, autocommit=True) as conn:
        day_rows = scalar(conn, f"SELECT count(*) FROM {TABLE}_p{first_day:%Y%m%d}")
        out["day_rows"] = day_rows
        # Retention that keeps all but the oldest day, so exactly that day's partition goes.
        lsn = scalar(conn, "SELECT pg_current_wal_lsn()::text")
        t0 = time.perf_counter()
        done = maintain_request_log(retention_days=info["days"] - 2)
        out["drop_s"] = round(time.perf_counter() - t0, 3)
        out["drop_wal"] = wal_bytes(conn, lsn)
        out["dropped"] = done.dropped
        print(f"  maintenance dropped {done.dropped} ({day_rows:,} rows) in {out['drop_s']} s", flush=True)

        # The same rows per day in a plain table of plain_days days (ids and indexes as before 0003).
        plain = "reqlog_plain"
        conn.execute(f"DROP TABLE IF EXISTS {plain}")
        conn.execute(f"CREATE TABLE {plain} (LIKE {TABLE} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
        # Days 2 .. plain_days + 1 of the data (day 1 is gone), in time order as the proxy writes them.
        start = dt.datetime.combine(first_day + dt.timedelta(days=1), dt.time(), tzinfo=dt.UTC)
        t0 = time.perf_counter()
        conn.execute(
            f"INSERT INTO {plain} SELECT * FROM {TABLE} WHERE created_at >= %s AND created_at < %s "
            "ORDER BY created_at",
            [start, start + dt.timedelta(days=plain_days)],
        )
        conn.execute(f"ALTER TABLE {plain} ADD PRIMARY KEY (id)")
        for suffix, cols in INDEXES.items():
            conn.execute(f"CREATE INDEX {plain}_{suffix} ON {plain} {cols}")
        conn.execute(f"VACUUM (ANALYZE) {plain}")
        out["plain_rows"] = scalar(conn, f"SELECT count(*) FROM {plain}")
        print(
            f"  plain table: {out['plain_rows']:,} rows ({time.perf_counter() - t0:.0f} s to build)",
            flush=True,
        )

        # prune_request_log is the production batch DELETE; run it against the plain table.
        lsn = scalar(conn, "SELECT pg_current_wal_lsn()::text")
        with model_on_table(plain):
            # It takes whole days back from now; the cutoff is the start of the plain table's second
            # day, so pass the fraction (timedelta accepts it) computed at the last moment.
            cutoff = start + dt.timedelta(days=1)
            t0 = time.perf_counter()
            deleted = prune_request_log((dt.datetime.now(dt.UTC) - cutoff).total_seconds() / 86400)  # type: ignore[arg-type]
            out["delete_s"] = round(time.perf_counter() - t0, 3)
        out["delete_wal"] = wal_bytes(conn, lsn)
        out["deleted"] = deleted
        print(f"  batch DELETE of {deleted:,} rows from the plain table: {out['delete_s']} s", flush=True)
        conn.execute(f"DROP TABLE {plain}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--runs", type=int, default=5, help="timed repetitions per query (median reported)")
    parser.add_argument("--workers", type=int, default=2, help="days loaded in parallel")
    parser.add_argument("--plain-days", type=int, default=5, help="days in the plain table for the DELETE")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    parser.add_argument("--json", type=Path, default=ROOT / "var" / "bench" / "request_log_scale.json")
    args = parser.parse_args()

    admin = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    if not admin.startswith("postgres"):
        sys.exit("DATABASE_URL must point at a PostgreSQL server (the scratch database is created there)")
    url = scratch_url(admin)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {SCRATCH_DB}")
        conn.execute(f"CREATE DATABASE {SCRATCH_DB}")
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inferchain.settings")
    import django

    django.setup()
    from django.core.management import call_command

    report: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    t_start = time.perf_counter()
    try:
        call_command("migrate", verbosity=0)
        print(f"filling {args.rows:,} rows over {args.days} days with {args.workers} workers", flush=True)
        info = fill(url, args.days, args.rows, args.workers)
        print(f"  {info['rows']:,} rows, {info['size']}, {info['fill_s']} s", flush=True)
        report["fill"] = {k: v for k, v in info.items() if k != "now"}
        print(f"explorer requests (median of {args.runs}):", flush=True)
        report["queries"] = time_queries(info, args.runs)
        print("retention:", flush=True)
        report["retention"] = retention(url, info, args.plain_days)
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {SCRATCH_DB} WITH (FORCE)")
    report["total_s"] = round(time.perf_counter() - t_start, 1)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2, default=str))
    print(f"done in {report['total_s']} s; JSON in {args.json}")


if __name__ == "__main__":
    main()
