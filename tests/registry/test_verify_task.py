"""POST .../verify/ queues the task on node.<host> in Redis; the task records a run for that host."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from core.redis_client import get_redis
from models_registry.models import VerificationRun
from models_registry.tasks import verify_version
from tests.registry.factories import register_dir

pytestmark = pytest.mark.django_db


def test_verify_action_sends_to_the_hosts_queue_after_commit(
    admin_client: APIClient,
    model_dir: Path,
    redis_clean: None,
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    version = register_dir(model_dir)
    queue_key = f"{settings.REDIS_KEY_PREFIX}node.gpu-7"
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = admin_client.post(
            f"/api/model-versions/{version.pk}/verify/", {"host_name": "gpu-7"}, format="json"
        )
    assert response.status_code == 202
    assert response.json()["queue"] == "node.gpu-7"
    assert get_redis().llen(queue_key) == 0  # nothing leaves before the commit
    for callback in callbacks:
        callback()
    [raw] = get_redis().lrange(queue_key, 0, -1)
    message = json.loads(raw)
    assert message["headers"]["task"] == "models_registry.verify_version"
    assert json.loads(base64.b64decode(message["body"]))[0] == [version.pk, "gpu-7"]


def test_task_records_a_run_for_the_host(model_dir: Path) -> None:
    version = register_dir(model_dir)
    run_id = verify_version.apply(args=(version.pk, "gpu-7")).get()
    run = VerificationRun.objects.get(pk=run_id)
    assert (run.host_name, run.ok, run.trigger) == ("gpu-7", True, "task")
    # Idempotent: running it again adds a second run and changes nothing else.
    verify_version.apply(args=(version.pk, "gpu-7")).get()
    assert version.verifications.filter(host_name="gpu-7").count() == 2


def test_viewer_cannot_queue_verification(viewer_client: APIClient, model_dir: Path) -> None:
    version = register_dir(model_dir)
    url = f"/api/model-versions/{version.pk}/verify/"
    assert viewer_client.post(url, {"host_name": "gpu-7"}, format="json").status_code == 403


def test_history_endpoint_filters_by_host(admin_client: APIClient, model_dir: Path) -> None:
    version = register_dir(model_dir)
    verify_version.apply(args=(version.pk, "gpu-7")).get()
    (model_dir / "config.json").write_text("{}")
    verify_version.apply(args=(version.pk, "gpu-8")).get()
    runs = admin_client.get(f"/api/model-versions/{version.pk}/verifications/?host_name=gpu-8").json()[
        "results"
    ]
    assert [(r["host_name"], r["ok"]) for r in runs] == [("gpu-8", False)]
    assert runs[0]["problems"][0]["path"] == "config.json"
    hosts = admin_client.get(f"/api/model-versions/{version.pk}/hosts/").json()
    assert {h["host_name"]: h["ok"] for h in hosts} == {"test-host": True, "gpu-7": True, "gpu-8": False}
    assert admin_client.get(f"/api/model-versions/{version.pk}/").json()["state"] == "failed"
