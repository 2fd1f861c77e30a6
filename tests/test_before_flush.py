"""The guards before a transactional test's flush (tests/before_flush.py): the live server turns new
requests away and waits for the ones inside, and other sessions still in a transaction on the test
database are waited for, then named."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from typing import Any

import psycopg
import pytest
from django.db import connection

from tests.before_flush import GatedApp, busy_sessions, gate, wait_until_quiet


def _call(app: GatedApp, path: str = "/api/agent/sync/") -> tuple[str, bytes]:
    status: list[str] = []
    body = app({"REQUEST_METHOD": "POST", "PATH_INFO": path}, lambda s, h: status.append(s))
    return (status[0] if status else "", b"".join(body))


def test_shutting_waits_for_the_request_inside_and_turns_new_ones_away() -> None:
    entered, release = threading.Event(), threading.Event()

    def slow(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        entered.set()
        release.wait(10)
        start_response("200 OK", [])
        return [b"synced"]

    app = GatedApp(slow)
    results: list[tuple[str, bytes]] = []
    inside = threading.Thread(target=lambda: results.append(_call(app)))
    inside.start()
    assert entered.wait(5)

    drained = threading.Event()

    def shut() -> None:
        app.shut_and_drain(10)
        drained.set()

    shutter = threading.Thread(target=shut)
    shutter.start()
    time.sleep(0.2)
    assert not drained.is_set()  # the sync inside still runs
    assert _call(app)[0].startswith("503")  # a request arriving now never reaches the app

    release.set()
    shutter.join(5)
    inside.join(5)
    assert drained.is_set()
    assert results == [("200 OK", b"synced")]

    app.reopen()
    release.set()
    assert _call(app) == ("200 OK", b"synced")


def test_a_request_still_inside_at_the_deadline_is_named() -> None:
    release = threading.Event()

    def stuck(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        release.wait(10)
        start_response("200 OK", [])
        return []

    app = GatedApp(stuck)
    inside = threading.Thread(target=_call, args=(app, "/api/agent/sync/"))
    inside.start()
    time.sleep(0.1)
    with pytest.raises(AssertionError, match=r"\['POST /api/agent/sync/'\]"):
        app.shut_and_drain(0.3)
    release.set()
    inside.join(5)


@pytest.mark.django_db(transaction=True)
def test_the_live_server_of_a_test_is_gated_and_open(live_server: Any) -> None:
    app = gate(live_server)
    assert live_server.thread.httpd.get_app() is app and app.open
    try:
        status = urllib.request.urlopen(f"{live_server.url}/api/audit/", timeout=10).status
    except urllib.error.HTTPError as answered:
        status = answered.code
    assert status in (401, 403)  # Django answered it (no session), not the gate's 503


@pytest.mark.django_db(transaction=True)
def test_a_session_left_in_a_transaction_is_waited_for_then_named() -> None:
    params = connection.get_connection_params()
    dsn = {k: params[k] for k in ("host", "port", "user", "dbname") if params.get(k)}
    with psycopg.connect(**dsn, application_name="leftover-tick") as other:
        other.execute("SELECT count(*) FROM nodes_host")  # opens a transaction and keeps its lock
        assert [row[2] for row in busy_sessions()] == ["leftover-tick"]
        with pytest.raises(AssertionError, match=r"leftover-tick.*nodes_host"):
            wait_until_quiet(0.3)

        threading.Timer(0.3, other.commit).start()
        started = time.monotonic()
        wait_until_quiet(10)  # returns once the other session has committed
        assert 0.2 < time.monotonic() - started < 5
        assert busy_sessions() == []
