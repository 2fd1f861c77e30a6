"""Session login for the console, token auth for scripts."""

from __future__ import annotations

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from console.models import User
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


def test_session_login_me_logout(viewer_user: User) -> None:
    client = APIClient(enforce_csrf_checks=True)
    csrf = client.get("/api/auth/csrf/").json()["csrfToken"]
    resp = client.post(
        "/api/auth/login/",
        {"username": viewer_user.username, "password": PASSWORD},
        format="json",
        HTTP_X_CSRFTOKEN=csrf,
    )
    assert resp.status_code == 200, resp.content
    assert resp.json()["role"] == "viewer"
    assert client.get("/api/auth/me/").json()["username"] == viewer_user.username
    csrf = client.cookies["csrftoken"].value
    assert client.post("/api/auth/logout/", HTTP_X_CSRFTOKEN=csrf).status_code == 204
    assert client.get("/api/auth/me/").status_code == 401


def test_wrong_password_is_a_clear_400(viewer_user: User) -> None:
    resp = APIClient().post(
        "/api/auth/login/", {"username": viewer_user.username, "password": "nope"}, format="json"
    )
    assert resp.status_code == 400
    assert resp.json()["non_field_errors"] == ["Wrong username or password."]


def test_session_writes_need_csrf(admin_user: User) -> None:
    client = APIClient(enforce_csrf_checks=True)
    client.login(username=admin_user.username, password=PASSWORD)
    assert client.post("/api/tenants/", {"name": "x"}, format="json").status_code == 403


def test_token_auth_for_scripts(admin_user: User) -> None:
    token = Token.objects.create(user=admin_user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    assert client.post("/api/tenants/", {"name": "scripted"}, format="json").status_code == 201
    client.credentials(HTTP_AUTHORIZATION="Token wrong")
    assert client.get("/api/tenants/").status_code == 401
