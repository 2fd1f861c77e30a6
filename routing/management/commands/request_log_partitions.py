"""`manage.py request_log_partitions [--show]`: run request-log maintenance, then list the partitions."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from routing.services import maintain_request_log, request_log_partitions


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "kB", "MB"):
        if size < 1024:
            return f"{size:.0f} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


class Command(BaseCommand):
    help = (
        "Create today's and the next REQUEST_LOG_PARTITIONS_AHEAD days' request-log partitions, drop "
        "those older than REQUEST_LOG_RETENTION_DAYS, and list the partitions (--show: list only)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--show", action="store_true", help="only list the partitions; change nothing")

    def handle(self, *args: Any, show: bool = False, **options: Any) -> None:
        if not show:
            done = maintain_request_log()
            if not done.partitioned:
                self.stdout.write(
                    f"request log is not partitioned; deleted {done.deleted_rows} rows past retention"
                )
                return
            if done.skipped:
                self.stdout.write("another process is maintaining the request log; nothing done")
            else:
                self.stdout.write(
                    f"created {len(done.created)} partitions "
                    f"({done.moved_rows} rows moved from the default), "
                    f"dropped {len(done.dropped)}, deleted {done.deleted_rows} stale rows from the default"
                )
            for name in done.failed:
                self.stderr.write(f"lock timeout on {name}; the next run retries it")
        parts = request_log_partitions()
        if not parts:
            self.stdout.write("request log is not partitioned (SQLite or migration 0003 not applied)")
            return
        self.stdout.write(f"{'partition':<32} {'day (UTC)':<10} {'rows (est.)':>12} {'size':>10}")
        for p in parts:
            rows = "?" if p.rows_estimate is None else f"{p.rows_estimate:,}"
            day = p.day.isoformat() if p.day else "default"
            self.stdout.write(f"{p.name:<32} {day:<10} {rows:>12} {_size(p.total_bytes):>10}")
