"""The console's own defences (docs/security.md): CSRF on session writes, cookie flags behind TLS,
session expiry, the Content-Security-Policy header and sign-in throttling, through real requests."""

from __future__ import annotations

import datetime as dt
import http.client
import json
from http.cookies import SimpleCookie
from pathlib import Path

import pytest
from django.contrib.sessions.models import Session
from django.test import Client, override_settings
from django.utils import timezone

from console.models import Tenant, User
from tests.conftest import PASSWORD
from tests.e2e.harness import start_console

pytestmark = pytest.mark.django_db


def _login(client: Client, username: str, password: str = PASSWORD, **extra: str) -> int:
    csrf = client.get("/api/auth/csrf/").json()["csrfToken"]
    resp = client.post(
        "/api/auth/login/",
        json.dumps({"username": username, "password": password}),
        content_type="application/json",
        HTTP_X_CSRFTOKEN=csrf,
        **extra,  # type: ignore[arg-type]
    )
    return int(resp.status_code)


# ---- CSRF -----------------------------------------------------------------------------------------


def test_a_session_write_without_the_csrf_token_is_refused_and_changes_nothing(
    admin_user: User,
) -> None:
    client = Client(enforce_csrf_checks=True)
    assert _login(client, admin_user.username) == 200
    body = json.dumps({"name": "forged"})
    resp = client.post("/api/tenants/", body, content_type="application/json")
    assert resp.status_code == 403
    assert resp.json()["detail"].startswith("CSRF Failed")
    # A token that is not this session's is no better than none.
    resp = client.post("/api/tenants/", body, content_type="application/json", HTTP_X_CSRFTOKEN="x" * 64)
    assert resp.status_code == 403
    assert not Tenant.objects.filter(name="forged").exists()
    # The same write with the session's token goes through: the refusal was the token, not the role.
    token = client.cookies["csrftoken"].value
    resp = client.post("/api/tenants/", body, content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert resp.status_code == 201, resp.content


def test_sign_in_itself_needs_the_csrf_token(admin_user: User) -> None:
    client = Client(enforce_csrf_checks=True)
    body = json.dumps({"username": admin_user.username, "password": PASSWORD})
    resp = client.post("/api/auth/login/", body, content_type="application/json")
    assert resp.status_code == 403 and resp.json()["detail"].startswith("CSRF Failed")
    assert "sessionid" not in client.cookies


# ---- session expiry --------------------------------------------------------------------------------


def test_a_session_past_its_age_is_signed_out(admin_user: User) -> None:
    client = Client()
    assert _login(client, admin_user.username) == 200
    assert client.get("/api/auth/me/").status_code == 200
    cookie = client.cookies["sessionid"]
    assert int(cookie["max-age"]) == 12 * 3600  # SESSION_COOKIE_AGE_SECONDS' default
    Session.objects.update(expire_date=timezone.now() - dt.timedelta(seconds=1))
    assert client.get("/api/auth/me/").status_code in (401, 403)


# ---- Content-Security-Policy -----------------------------------------------------------------------


def test_every_console_response_carries_the_policy(admin_user: User) -> None:
    client = Client()
    for path in ("/", "/tenants", "/api/auth/csrf/", "/api/docs/"):
        policy = client.get(path)["Content-Security-Policy"]
        directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
        assert directives["script-src"] == "'self'", (path, policy)
        assert directives["object-src"] == "'none'" and directives["frame-ancestors"] == "'none'"
        assert "unsafe-eval" not in policy
        if path == "/api/docs/":
            assert directives["style-src"] == "'self' 'unsafe-inline'"
        else:
            assert "unsafe-inline" not in policy, (path, policy)
    # Swagger UI's init script is a file of its own (no inline script on the docs page).
    page = client.get("/api/docs/").content.decode()
    assert "<script>" not in page and "?script=" in page
    script = client.get("/api/docs/?script=")
    assert script.status_code == 200 and script["Content-Type"].startswith("application/javascript")


# ---- cookies behind TLS ----------------------------------------------------------------------------


def _set_cookies(headers: list[tuple[str, str]]) -> dict[str, SimpleCookie]:
    found: dict[str, SimpleCookie] = {}
    for name, value in headers:
        if name.lower() == "set-cookie":
            cookie: SimpleCookie = SimpleCookie()
            cookie.load(value)
            found.update({key: cookie for key in cookie})
    return found


def _console_login(port: int, username: str, forwarded_proto: str) -> tuple[int, dict[str, SimpleCookie]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/api/auth/csrf/", headers={"X-Forwarded-Proto": forwarded_proto})
    resp = conn.getresponse()
    token = json.loads(resp.read())["csrfToken"]
    csrf_cookie = _set_cookies(resp.getheaders())["csrftoken"]["csrftoken"].value
    body = json.dumps({"username": username, "password": PASSWORD})
    conn.request(
        "POST",
        "/api/auth/login/",
        body=body,
        headers={
            "Content-Type": "application/json",
            "X-Forwarded-Proto": forwarded_proto,
            "X-CSRFToken": token,
            "Cookie": f"csrftoken={csrf_cookie}",
            # Over HTTPS Django also checks that the Origin is this site.
            "Origin": f"{forwarded_proto}://127.0.0.1:{port}",
            "Host": f"127.0.0.1:{port}",
        },
    )
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp.status, _set_cookies(resp.getheaders())


@pytest.mark.django_db(transaction=True)
def test_behind_a_tls_proxy_cookies_are_secure_httponly_and_samesite(tmp_path: Path) -> None:
    from tests.conftest import make_user

    user = make_user("tls-admin", "admin")
    console = start_console(tmp_path, {"BEHIND_TLS_PROXY": "true"})
    try:
        status, cookies = _console_login(console.port, user.username, "https")
        assert status == 200
        session = cookies["sessionid"]["sessionid"]
        assert session["secure"] and session["httponly"] and session["samesite"] == "Lax"
        csrf = cookies["csrftoken"]["csrftoken"]
        assert csrf["secure"] and csrf["samesite"] == "Lax"
    finally:
        console.stop()


@override_settings(SECURE_PROXY_SSL_HEADER=None, SESSION_COOKIE_SECURE=False)
def test_without_tls_the_demo_still_signs_in_over_http(admin_user: User) -> None:
    client = Client()
    assert _login(client, admin_user.username) == 200
    session = client.cookies["sessionid"]
    assert not session["secure"] and session["httponly"] and session["samesite"] == "Lax"


# ---- sign-in throttling ----------------------------------------------------------------------------


@pytest.mark.usefixtures("redis_clean")
@override_settings(LOGIN_MAX_FAILURES_PER_USERNAME=3, LOGIN_MAX_FAILURES_PER_ADDRESS=5)
def test_failed_sign_ins_are_throttled_per_username(admin_user: User, viewer_user: User) -> None:
    client = Client()
    for _ in range(3):
        assert _login(client, admin_user.username, "wrong") == 400
    # Past the limit even the right password is refused: guessing learns nothing from the answer.
    csrf = client.get("/api/auth/csrf/").json()["csrfToken"]
    resp = client.post(
        "/api/auth/login/",
        json.dumps({"username": admin_user.username.upper(), "password": PASSWORD}),
        content_type="application/json",
        HTTP_X_CSRFTOKEN=csrf,
    )
    assert resp.status_code == 429
    body = resp.json()
    assert body["detail"].startswith("Too many failed sign-ins from this username.")
    assert 0 < body["retry_after"] <= 900 and resp["Retry-After"] == str(body["retry_after"])
    # Another username from the same address is still let in (3 failures < the address's 5).
    assert _login(Client(), viewer_user.username) == 200


@pytest.mark.usefixtures("redis_clean")
@override_settings(LOGIN_MAX_FAILURES_PER_USERNAME=100, LOGIN_MAX_FAILURES_PER_ADDRESS=4)
def test_failed_sign_ins_are_throttled_per_source_address(admin_user: User) -> None:
    for i in range(4):
        assert _login(Client(), f"guess-{i}", "wrong", REMOTE_ADDR="203.0.113.7") == 400
    assert _login(Client(), admin_user.username, REMOTE_ADDR="203.0.113.7") == 429
    assert _login(Client(), admin_user.username, REMOTE_ADDR="203.0.113.8") == 200


@pytest.mark.usefixtures("redis_clean")
@override_settings(
    LOGIN_MAX_FAILURES_PER_USERNAME=100,
    LOGIN_MAX_FAILURES_PER_ADDRESS=2,
    LOGIN_CLIENT_ADDRESS_HEADER="X-Forwarded-For",
)
def test_behind_a_proxy_the_address_comes_from_its_header(admin_user: User) -> None:
    for i in range(2):
        assert _login(Client(), f"g{i}", "wrong", HTTP_X_FORWARDED_FOR="198.51.100.1, 10.0.0.9") == 400
    # The last entry is the one the nearest proxy wrote; a client cannot dodge by prepending others.
    assert _login(Client(), admin_user.username, HTTP_X_FORWARDED_FOR="1.2.3.4, 10.0.0.9") == 429
    assert _login(Client(), admin_user.username, HTTP_X_FORWARDED_FOR="10.0.0.10") == 200


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("redis_clean")
def test_the_limit_holds_across_web_processes(tmp_path: Path) -> None:
    """Two console processes share one count: failures spread over both still reach the limit."""
    from tests.conftest import make_user

    user = make_user("shared-admin", "admin")
    env = {"LOGIN_MAX_FAILURES_PER_USERNAME": "4", "LOGIN_MAX_FAILURES_PER_ADDRESS": "50"}
    consoles = [start_console(tmp_path, env), start_console(tmp_path, env)]
    try:
        statuses = []
        for i in range(5):
            port = consoles[i % 2].port
            statuses.append(_post_login(port, user.username, "wrong"))
        assert statuses == [400, 400, 400, 400, 429]
        assert _post_login(consoles[1].port, user.username, PASSWORD) == 429
    finally:
        for console in consoles:
            console.stop()


def _post_login(port: int, username: str, password: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/api/auth/csrf/")
    resp = conn.getresponse()
    token = json.loads(resp.read())["csrfToken"]
    cookie = _set_cookies(resp.getheaders())["csrftoken"]["csrftoken"].value
    conn.request(
        "POST",
        "/api/auth/login/",
        body=json.dumps({"username": username, "password": password}),
        headers={"Content-Type": "application/json", "X-CSRFToken": token, "Cookie": f"csrftoken={cookie}"},
    )
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp.status
