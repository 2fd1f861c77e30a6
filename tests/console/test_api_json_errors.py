"""Every error under /api/ is JSON in DRF's shape; an oversized body is a quiet 413; other paths keep
Django's and the SPA's pages."""

from __future__ import annotations

import logging

import pytest
from django.conf import settings
from django.test import Client
from pytest_django.fixtures import Settings
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("debug", [False, True], ids=["production", "debug"])
def test_unknown_api_paths_are_a_json_404(settings: Settings, debug: bool) -> None:
    settings.DEBUG = debug  # DEBUG would draw Django's technical 404 page
    client = Client()
    for method, path in (("get", "/api/nope/"), ("post", "/api/nope/"), ("get", "/api/tenants/x/y/")):
        resp = getattr(client, method)(path)
        assert resp.status_code == 404
        assert resp["Content-Type"] == "application/json"
        assert resp.json() == {"detail": "Not found."}


def test_a_missing_trailing_slash_still_redirects() -> None:
    resp = Client().get("/api/tenants")
    assert resp.status_code == 301 and resp["Location"] == "/api/tenants/"


def test_a_20_mb_login_body_is_a_413_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    body = b'{"username": "' + b"x" * (20 * 1024 * 1024) + b'", "password": "p"}'
    with caplog.at_level(logging.INFO):
        resp = Client().post("/api/auth/login/", data=body, content_type="application/json")
    assert resp.status_code == 413
    assert resp.json() == {
        "detail": f"Request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes."
    }
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


def test_drf_errors_keep_their_own_shape() -> None:
    resp = Client().get("/api/tenants/")
    assert resp.status_code in (401, 403) and set(resp.json()) == {"detail"}
    resp = Client().post("/api/auth/login/", data={"username": "a"}, content_type="application/json")
    assert resp.status_code == 400 and resp.json() == {"password": ["This field is required."]}


def test_other_paths_are_unchanged() -> None:
    client = Client()
    spa = client.get("/nodes/123")  # the SPA's index page, or its "not built yet" note
    assert spa.status_code in (200, 503) and not spa["Content-Type"].startswith("application/json")
    static = client.get("/static/no-such-file.js")
    assert static.status_code == 404 and not static["Content-Type"].startswith("application/json")


def test_a_lost_database_is_a_json_503_without_a_traceback(
    admin_client: APIClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The whole path with a real outage is tests/routing/test_fault_postgres_down.py; here the query
    fails as it does when the server went away (OperationalError from the driver)."""
    from django.db import OperationalError
    from django.db.backends.utils import CursorWrapper

    def down(*args: object, **kwargs: object) -> None:
        raise OperationalError("connection failed: server closed the connection unexpectedly")

    monkeypatch.setattr(CursorWrapper, "execute", down)
    with caplog.at_level(logging.INFO):
        resp = admin_client.get("/api/tenants/")
    assert resp.status_code == 503
    assert resp["Retry-After"] == "5"
    body = resp.json()
    assert body["code"] == "database_unavailable" and "database is unavailable" in body["detail"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert any("database unavailable" in r.getMessage() for r in caplog.records)
