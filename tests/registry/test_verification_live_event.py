"""A finished verification is pushed to the version's live group, so an open page updates itself."""

from __future__ import annotations

from pathlib import Path

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from console.models import User
from core.consumers import LiveConsumer
from models_registry.services import verify_version_on_host, version_group
from tests.registry.factories import register_dir

pytestmark = [pytest.mark.django_db(transaction=True)]


async def test_failed_run_reaches_a_subscribed_browser(model_dir: Path, redis_clean: None) -> None:
    version = await database_sync_to_async(register_dir)(model_dir)
    user = await database_sync_to_async(User.objects.create)(username="watcher", role="viewer")
    comm = WebsocketCommunicator(LiveConsumer.as_asgi(), "/ws/live/")
    comm.scope["user"] = user
    connected, _ = await comm.connect()
    assert connected
    await comm.send_json_to({"subscribe": version_group(version.pk)})
    assert (await comm.receive_json_from(timeout=3))["type"] == "subscribed"

    (model_dir / "config.json").write_text("{}")
    run = await database_sync_to_async(verify_version_on_host)(version.pk, "gpu-9")

    event = await comm.receive_json_from(timeout=5)
    assert event == {
        "type": "verification",
        "version": version.pk,
        "run": run.pk,
        "host_name": "gpu-9",
        "ok": False,
        "problems": 1,
        "state": "failed",
    }
    await comm.disconnect()
