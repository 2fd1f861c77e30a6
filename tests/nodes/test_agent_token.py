"""Per-host agent tokens: issued when a host is registered (shown once, stored hashed), rotated and
revoked by admins (audited); a missing, wrong, revoked or other host's token is refused with a JSON
error and logged (by prefix, never the token)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from core.models import AuditEvent
from nodes.agent_tokens import hash_agent_token, issue_agent_token
from nodes.models import AgentToken, Host
from tests.nodes.conftest import make_host

pytestmark = pytest.mark.django_db


def sync(client: Any, host: str, token: str | None) -> Any:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token is not None else {}
    return client.post("/api/agent/sync/", {"host": host}, content_type="application/json", **headers)


def test_registering_a_host_shows_its_token_once_and_stores_a_hash(admin_client: Any, client: Any) -> None:
    response = admin_client.post("/api/hosts/", {"name": "gpu-7", "address": "10.0.0.7"}, format="json")
    assert response.status_code == 201, response.content
    raw = response.json()["new_agent_token"]
    assert raw.startswith("ict_") and len(raw) > 40
    stored = AgentToken.objects.get(host__name="gpu-7")
    assert stored.hashed_token == hash_agent_token(raw) and raw not in stored.hashed_token
    assert response.json()["agent_token"]["prefix"] == raw[:12]
    again = admin_client.get(f"/api/hosts/{response.json()['id']}/").json()
    assert again["new_agent_token"] is None and again["agent_token"]["prefix"] == raw[:12]
    assert AuditEvent.objects.filter(object_type="nodes.agenttoken").exists()
    assert raw not in str(list(AuditEvent.objects.values_list("before", "after")))
    assert sync(client, "gpu-7", raw).status_code == 200


def test_refusals_are_json_and_logged_without_the_token(
    client: Any, caplog: pytest.LogCaptureFixture, settings: Any, tmp_path: Any
) -> None:
    settings.ENGINE_LOG_DIR = tmp_path
    a, b = make_host("node-a"), make_host("node-b")
    token_a = issue_agent_token(a).raw_token
    token_b = issue_agent_token(b).raw_token
    caplog.set_level(logging.WARNING, logger="nodes.agent_channel")

    missing = sync(client, "node-a", None)
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "agent_token_missing"
    wrong = sync(client, "node-a", "ict_" + "x" * 43)
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "agent_token_invalid"
    other = sync(client, "node-a", token_b)
    assert other.status_code == 403 and other.json()["error"]["code"] == "agent_token_wrong_host"
    assert "another host" in other.json()["error"]["message"]
    old = token_a
    token_a = issue_agent_token(a).raw_token  # rotation revokes the old one
    revoked = sync(client, "node-a", old)
    assert revoked.status_code == 401 and revoked.json()["error"]["code"] == "agent_token_revoked"
    assert sync(client, "node-a", token_a).status_code == 200

    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 4
    assert any(token_b[:12] in line and "token of host node-b" in line for line in refusals)
    assert not any(t in line for line in refusals for t in (token_a, token_b, old))


def test_admins_rotate_and_revoke_from_the_console(
    admin_client: Any, client: Any, viewer_client: Any
) -> None:
    host = make_host("node-c")
    first = issue_agent_token(host).raw_token
    assert viewer_client.post(f"/api/hosts/{host.pk}/rotate-agent-token/").status_code == 403

    rotated = admin_client.post(f"/api/hosts/{host.pk}/rotate-agent-token/")
    assert rotated.status_code == 200
    second = rotated.json()["new_agent_token"]
    assert second and second != first
    assert sync(client, "node-c", first).status_code == 401
    assert sync(client, "node-c", second).status_code == 200

    revoked = admin_client.post(f"/api/hosts/{host.pk}/revoke-agent-token/")
    assert revoked.status_code == 200 and revoked.json()["agent_token"] is None
    assert sync(client, "node-c", second).json()["error"]["code"] == "agent_token_revoked"
    actions = list(AuditEvent.objects.filter(object_id__in=[str(host.pk)]).values_list("action", flat=True))
    assert "revoke" in actions
    assert AuditEvent.objects.filter(object_type="nodes.agenttoken", action="create").count() == 2


def test_a_log_answer_for_another_hosts_request_is_refused(client: Any, settings: Any, tmp_path: Any) -> None:
    settings.ENGINE_LOG_DIR = tmp_path
    a = make_host("node-a")
    token = issue_agent_token(a).raw_token
    response = client.post(
        "/api/agent/logs/",
        {"host": "node-a", "request_id": "nope", "deployment_id": 1, "text": "forged"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "log_request_unknown"
    assert Host.objects.filter(name="node-a").exists()


def test_the_host_list_shows_token_prefixes_without_a_query_per_host(
    admin_client: Any, django_assert_max_num_queries: Any, settings: Any, tmp_path: Any
) -> None:
    settings.ENGINE_LOG_DIR = tmp_path
    prefixes = {}
    for n in range(4):
        host = make_host(f"node-{n}")
        prefixes[host.name] = issue_agent_token(host).token.prefix
    with django_assert_max_num_queries(8):
        body = admin_client.get("/api/hosts/").json()
    shown = {row["name"]: row["agent_token"]["prefix"] for row in body["results"]}
    assert shown == prefixes
    assert all(row["new_agent_token"] is None for row in body["results"])
