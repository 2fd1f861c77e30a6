"""A transactional test's database is quiet before pytest-django flushes it.

Why: a transactional test ends with one TRUNCATE of every table, which takes their exclusive locks one by
one. A transaction of another connection that holds a lock on a table the TRUNCATE has yet to reach, and
waits for one it already holds, is a deadlock: PostgreSQL ends the flush ("deadlock detected" at teardown,
CI of 2026-12-06), and the next test on that worker finds the last one's rows ("duplicate key ...
node-a"). That CI run's other party was pytest-django's live server (a thread of this process, for the
whole session): a test's teardown killed its fleet agent, but a sync the agent had sent just before ran on
in the server's request thread, reading and writing several tables in one transaction.

Two guards, both run by the autouse fixture in tests/conftest.py between the test's own teardown and the
flush:
- `GatedApp` shuts the live server to new requests, then waits for those inside. A request sent before
  the kill but accepted after it would slip past a plain "wait until idle"; behind the gate it gets a 503
  without touching the database.
- `wait_until_quiet` waits for every other session on the test database (a supervisor's tick in a thread,
  a subprocess still writing) to leave its transaction, and names the ones that do not, instead of letting
  the TRUNCATE race them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from django.db import DatabaseError, connection

# A sync or a tick takes tens of milliseconds; one still running this long after its test is a bug the
# test should name rather than a deadlock.
DRAIN_SECONDS = 30.0

BUSY_SESSIONS = """
    SELECT pid, state, application_name, left(query, 160)
    FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid()
      AND state IN ('active', 'idle in transaction', 'idle in transaction (aborted)')
    ORDER BY pid
"""


class GatedApp:
    """The live server's WSGI app behind a gate that counts the requests inside it."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.open = True
        self.inside: dict[int, str] = {}  # request thread -> "METHOD path", for the error that names them
        self.changed = threading.Condition()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        me = threading.get_ident()
        with self.changed:
            if not self.open:
                start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
                return [b"the test that used this live server has ended"]
            self.inside[me] = f"{environ.get('REQUEST_METHOD')} {environ.get('PATH_INFO')}"
        try:
            # Django's WSGIHandler does a view's whole work (and commits) inside this call; only a
            # streamed body would run on after it, and no live-server test streams.
            return self.app(environ, start_response)
        finally:
            with self.changed:
                del self.inside[me]
                self.changed.notify_all()

    def reopen(self) -> None:
        with self.changed:
            self.open = True

    def shut_and_drain(self, timeout: float = DRAIN_SECONDS) -> None:
        """Turn new requests away, then wait for those inside; raise naming any still inside."""
        with self.changed:
            self.open = False
            if not self.changed.wait_for(lambda: not self.inside, timeout):
                raise AssertionError(
                    f"the live server was still serving {sorted(self.inside.values())} {timeout:.0f} s "
                    "after the test ended; the database flush would race it"
                )


def gate(live_server: Any) -> GatedApp:
    """The gate in front of `live_server`'s app, put there on first use (the server lives for the session)."""
    httpd = live_server.thread.httpd
    app = httpd.get_app()
    if not isinstance(app, GatedApp):
        app = GatedApp(app)
        httpd.set_app(app)
    return app


def busy_sessions() -> list[tuple[Any, ...]]:
    """Other sessions on this test database inside a statement or a transaction."""
    with connection.cursor() as cursor:
        cursor.execute(BUSY_SESSIONS)
        return list(cursor.fetchall())


def wait_until_quiet(timeout: float = DRAIN_SECONDS) -> None:
    """Wait until no other session on the test database is in a transaction; raise naming those that stay.
    A database this connection cannot reach (a test that stopped its server) is left to the flush."""
    deadline = time.monotonic() + timeout
    try:
        while busy := busy_sessions():
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"other sessions were still busy on the test database {timeout:.0f} s after the test "
                    f"ended (pid, state, application, query): {busy}; the database flush would race them"
                )
            time.sleep(0.05)
    except DatabaseError:
        return
