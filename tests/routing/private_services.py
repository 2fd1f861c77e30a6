"""Private Redis and PostgreSQL servers that a fault test may stop and restart.

The shared servers (6379, 5432) serve every engineer and CI job on the machine, so a test that takes a
server down starts its own on a free loopback port in a temporary directory and points the processes
under test at it. PostgreSQL gets a copy of this run's test database (schema and committed rows).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from django.db import connection

from tests.private_redis import PrivateRedis
from tests.routing.conftest import free_port

__all__ = ["PG_BIN", "PrivatePostgres", "PrivateRedis"]


def _pg_bin() -> Path:
    """Debian keeps initdb and pg_ctl out of PATH, under /usr/lib/postgresql/<version>/bin."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else Path("/usr/lib/postgresql/15/bin")


PG_BIN = _pg_bin()


class PrivatePostgres:
    """A PostgreSQL 15 cluster owned by the `postgres` OS user, with a copy of the test database."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="fault-pg-"))
        self.data = self.dir / "data"
        self.dbname = "faults"
        if os.geteuid() == 0:  # initdb refuses to run as root: the cluster belongs to `postgres`
            shutil.chown(self.dir, "postgres", "postgres")

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{self.dbname}"

    def _as_postgres(self, *argv: str) -> None:
        cmd = ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else list(argv)
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def init_from_test_database(self) -> None:
        self._as_postgres(
            str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync"
        )
        self.start()
        connection.ensure_connection()
        source = connection.settings_dict
        dump = subprocess.run(
            [
                str(PG_BIN / "pg_dump"),
                "-h",
                str(source.get("HOST") or "127.0.0.1"),
                "-p",
                str(source.get("PORT") or 5432),
                "-U",
                str(source.get("USER") or "postgres"),
                "--no-owner",
                str(source["NAME"]),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        ).stdout
        psql = [str(PG_BIN / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres"]
        subprocess.run(
            [*psql, "-c", f"CREATE DATABASE {self.dbname}"], check=True, capture_output=True, timeout=60
        )
        subprocess.run(
            [*psql, "-q", "-v", "ON_ERROR_STOP=1", "-d", self.dbname],
            input=dump,
            check=True,
            capture_output=True,
            timeout=120,
        )

    def start(self) -> None:
        self._as_postgres(
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.dir / "pg.log"),
            "-o",
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off",
            "-w",
            "start",
        )

    def stop(self) -> None:
        """Immediate shutdown: open connections are cut, as when the server crashes or is partitioned."""
        if (self.data / "postmaster.pid").exists():
            self._as_postgres(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def query(self, sql: str) -> list[tuple[object, ...]]:
        import psycopg

        with psycopg.connect(self.url, connect_timeout=5) as conn:
            return list(conn.execute(sql.encode()).fetchall())

    def close(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
