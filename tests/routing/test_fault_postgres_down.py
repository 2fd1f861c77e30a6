"""PostgreSQL stopped under load: the proxy keeps serving from its config snapshot, request-log rows are
spooled and every one arrives once the database is back (counted), and the console's API answers a
clear 503 `database_unavailable` instead of 500s, then recovers without a restart.

PostgreSQL is a private cluster on its own port holding a copy of this run's test database (the shared
server serves everyone on the machine and is never stopped).
"""

from __future__ import annotations

import http.cookiejar
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from console.choices import Role
from tests.conftest import PASSWORD, make_user
from tests.e2e.harness import start_console
from tests.routing.conftest import Proc, make_tenant_key
from tests.routing.fleet import start_member
from tests.routing.load import Client, Load, summary
from tests.routing.private_services import PrivatePostgres

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
BODY = {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
OUTAGE_S = 5.0


@pytest.fixture
def private_pg() -> Iterator[PrivatePostgres]:
    server = PrivatePostgres()
    yield server
    server.close()


def _metric(url: str, name: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE))


class Browser:
    """A signed-in console session (cookie jar, CSRF header), as the SPA holds one."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def call(self, method: str, path: str, body: object = None) -> tuple[int, dict[str, str], object]:
        csrf = next((c.value for c in self.jar if c.name == "csrftoken"), "")
        req = urllib.request.Request(
            self.base + path,
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={"Content-Type": "application/json", "X-CSRFToken": csrf or "", "Referer": self.base},
        )
        try:
            with self.opener.open(req, timeout=15) as resp:
                return resp.status, dict(resp.headers), json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                parsed: object = json.loads(raw)
            except ValueError:
                parsed = raw.decode(errors="replace")
            return err.code, dict(err.headers), parsed


def test_postgres_down_under_load(
    start_proxy: Callable[..., Proc], private_pg: PrivatePostgres, tmp_path: Path
) -> None:
    member = start_member("llama")
    console = None
    try:
        tk = make_tenant_key()
        make_user("olga-operator", Role.ADMIN)
        private_pg.init_from_test_database()
        spool = tmp_path / "spool"
        proxy = start_proxy(
            DATABASE_URL=private_pg.url,
            PROXY_CONFIG_REFRESH_SECONDS="1",
            REQUEST_LOG_SPOOL_DIR=str(spool),
        )
        console = start_console(tmp_path, {"DATABASE_URL": private_pg.url})
        browser = Browser(console.url)
        browser.call("GET", "/api/auth/csrf/")
        status, _, _ = browser.call(
            "POST", "/api/auth/login/", {"username": "olga-operator", "password": PASSWORD}
        )
        assert status == 200
        assert browser.call("GET", "/api/tenants/")[0] == 200

        clients = [Client("c", proxy.url + "/v1/chat/completions", tk.raw_key, BODY, concurrency=3)]
        with Load(clients, timeout=10, pause=0.02) as load:
            time.sleep(2.0)
            down_at = time.monotonic()
            private_pg.stop()
            time.sleep(1.0)
            console_during = [
                browser.call("GET", path) for path in ("/api/tenants/", "/api/auth/me/", "/api/hosts/")
            ]
            time.sleep(OUTAGE_S - 1.0)
            spooled_files = len(list(spool.glob("*.jsonl")))
            spooled_rows = _metric(proxy.url, "inferchain_proxy_request_log_spooled_total")
            private_pg.start()
            up_at = time.monotonic()
            time.sleep(2.0)
        answered = [s for s in load.samples if s.status]
        during = load.between(down_at, up_at)

        # Every answered request has its row once the database is back: the spool is replayed.
        deadline = time.monotonic() + 20
        rows = 0
        while time.monotonic() < deadline:
            rows = int(private_pg.query("SELECT count(*) FROM routing_requestlog")[0][0])  # type: ignore[call-overload]
            if rows >= len(answered) and not list(spool.glob("*.jsonl")):
                break
            time.sleep(0.5)
        arrived_s = time.monotonic() - up_at
        console_after = browser.call("GET", "/api/tenants/")
        print(
            f"\npostgres down {OUTAGE_S:.0f} s: clients saw {summary(load.samples)} "
            f"({len(during)} during the outage); "
            f"rows spooled {spooled_rows:.0f} in {spooled_files} files; request-log rows {rows} for "
            f"{len(answered)} answered requests, all in {arrived_s:.1f} s after the database returned; "
            f"console during: {[c[0] for c in console_during]}, after: {console_after[0]}"
        )

        assert during and all(s.status == 200 for s in load.samples), summary(load.samples)
        assert spooled_rows > 0 and spooled_files > 0
        assert rows == len(answered)
        assert not list(spool.glob("*.jsonl"))
        for status, headers, body in console_during:
            assert status == 503, (status, body)
            assert isinstance(body, dict) and body["code"] == "database_unavailable", body
            assert "database is unavailable" in body["detail"]
            assert {k.lower(): v for k, v in headers.items()}.get("retry-after") == "5"
        assert console_after[0] == 200, console_after
        assert "Traceback" not in console.log_path.read_text(errors="replace")
        assert proxy.proc.poll() is None
    finally:
        member.sim.stop()
        if console is not None:
            console.stop()
