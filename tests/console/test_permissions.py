"""Each role against each endpoint: the API enforces what the UI only hides."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tests.console.factories import make_key, make_tenant

pytestmark = pytest.mark.django_db


def _targets() -> list[tuple[str, str, dict[str, object] | None]]:
    tenant = make_tenant("perm")
    issued = make_key(tenant)
    return [
        ("get", "/api/tenants/", None),
        ("post", "/api/tenants/", {"name": "new"}),
        ("patch", f"/api/tenants/{tenant.pk}/", {"description": "x"}),
        ("get", "/api/keys/", None),
        ("post", "/api/keys/", {"tenant": tenant.pk, "name": "n"}),
        ("post", f"/api/keys/{issued.api_key.pk}/revoke/", None),
        ("get", "/api/audit/", None),
        ("get", "/api/users/", None),
        ("post", "/api/users/", {"username": "bob", "role": "viewer"}),
        ("delete", f"/api/tenants/{tenant.pk}/", None),
    ]


def _call(client: APIClient, method: str, url: str, body: dict[str, object] | None) -> int:
    return getattr(client, method)(url, body, format="json").status_code


@pytest.mark.parametrize("role_client", ["viewer_client", "evaluator_client"])
def test_read_only_roles_can_read_but_not_write(role_client: str, request: pytest.FixtureRequest) -> None:
    client: APIClient = request.getfixturevalue(role_client)
    for method, url, body in _targets():
        status = _call(client, method, url, body)
        if url == "/api/users/":
            assert status == 403, (method, url)  # accounts are admin-only, even to read
        elif method == "get":
            assert status == 200, (method, url)
        else:
            assert status == 403, (method, url, status)


def test_anonymous_gets_401_everywhere(anon_client: APIClient) -> None:
    for method, url, body in _targets():
        assert _call(anon_client, method, url, body) == 401, (method, url)


def test_admin_can_do_everything(admin_client: APIClient) -> None:
    expected = {"get": 200, "post": 201, "patch": 200, "delete": 204}
    for method, url, body in _targets():
        status = _call(admin_client, method, url, body)
        want = 200 if url.endswith("/revoke/") else expected[method]
        assert status == want, (method, url, status)


def test_evaluator_may_write_where_a_view_allows_it(evaluator_user: object) -> None:
    from types import SimpleNamespace

    from console.permissions import RolePermission

    request = SimpleNamespace(user=evaluator_user, method="POST")
    assert RolePermission().has_permission(request, SimpleNamespace(evaluator_writable=True)) is True  # type: ignore[arg-type]
    assert RolePermission().has_permission(request, SimpleNamespace()) is False  # type: ignore[arg-type]
