"""Aliases: switching the active version is audited, pushed to proxies, and refuses failed versions."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from core.models import AuditEvent
from core.redis_client import CONFIG_CHANNEL, get_redis, key
from models_registry.models import ModelAlias, ModelVersion
from models_registry.services import verify_version_on_host
from tests.registry.conftest import make_model_dir
from tests.registry.factories import make_model, register_dir

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_versions(model_root: Path) -> tuple[ModelVersion, ModelVersion]:
    model = make_model()
    first = register_dir(make_model_dir(model_root, "v1"), model=model, revision="v1")
    second = register_dir(make_model_dir(model_root, "v2"), model=model, revision="v2")
    return first, second


def test_switch_is_audited_and_published(
    admin_client: APIClient,
    two_versions: tuple[ModelVersion, ModelVersion],
    redis_clean: None,
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    first, second = two_versions
    created = admin_client.post(
        "/api/model-aliases/",
        {"name": "llama-3-8b", "active_version": first.pk, "task_tags": ["Chat"]},
        format="json",
    )
    assert created.status_code == 201, created.json()
    assert created.json()["task_tags"] == ["chat"]
    alias_id = created.json()["id"]

    pubsub = get_redis().pubsub()
    pubsub.subscribe(key(CONFIG_CHANNEL))
    pubsub.get_message(timeout=1)  # the subscribe confirmation
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(
            f"/api/model-aliases/{alias_id}/switch/", {"version": second.pk}, format="json"
        )
    assert response.status_code == 200
    assert response.json()["active_version"] == second.pk
    assert ModelAlias.objects.get(pk=alias_id).active_version_id == second.pk

    event = AuditEvent.objects.get(action="switch")
    assert event.actor_name == "alice-admin"
    assert event.before == {"active_version": first.pk, "version": "tiny-llama@v1"}
    assert event.after == {"active_version": second.pk, "version": "tiny-llama@v2"}

    message = pubsub.get_message(timeout=2)
    pubsub.close()
    assert message is not None
    assert json.loads(message["data"]) == {
        "kind": "model_alias",
        "name": "llama-3-8b",
        "active_version": second.pk,
    }
    assert settings.REDIS_KEY_PREFIX in key(CONFIG_CHANNEL)


def test_patch_cannot_switch_behind_the_audit(
    admin_client: APIClient, two_versions: tuple[ModelVersion, ModelVersion]
) -> None:
    first, second = two_versions
    alias = ModelAlias.objects.create(name="m", active_version=first)
    response = admin_client.patch(
        f"/api/model-aliases/{alias.pk}/", {"active_version": second.pk}, format="json"
    )
    assert response.status_code == 400
    assert ModelAlias.objects.get(pk=alias.pk).active_version_id == first.pk


def test_switch_to_a_failed_version_is_refused(
    admin_client: APIClient, two_versions: tuple[ModelVersion, ModelVersion], model_root: Path
) -> None:
    first, second = two_versions
    (model_root / "v2" / "config.json").write_text("{}")
    assert not verify_version_on_host(second.pk, "node-a").ok
    alias = ModelAlias.objects.create(name="m", active_version=first)
    response = admin_client.post(
        f"/api/model-aliases/{alias.pk}/switch/", {"version": second.pk}, format="json"
    )
    assert response.status_code == 400
    assert "failed verification" in response.json()["version"][0]
    assert not AuditEvent.objects.filter(action="switch").exists()


def test_only_admins_switch(
    viewer_client: APIClient, evaluator_client: APIClient, two_versions: tuple[ModelVersion, ModelVersion]
) -> None:
    first, second = two_versions
    alias = ModelAlias.objects.create(name="m", active_version=first)
    for client in (viewer_client, evaluator_client):
        url = f"/api/model-aliases/{alias.pk}/switch/"
        assert client.post(url, {"version": second.pk}, format="json").status_code == 403
        assert client.get("/api/model-aliases/").status_code == 200
    assert ModelAlias.objects.get(pk=alias.pk).active_version_id == first.pk


def test_alias_names_have_no_spaces(
    admin_client: APIClient, two_versions: tuple[ModelVersion, ModelVersion]
) -> None:
    response = admin_client.post(
        "/api/model-aliases/", {"name": "llama 3", "active_version": two_versions[0].pk}, format="json"
    )
    assert response.status_code == 400
    assert "name" in response.json()
