"""The /ws/live/ consumer over the real Redis channel layer."""

from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser

from console.models import User
from core.consumers import LiveConsumer
from core.live import FLEET_GROUP, host_group, push_live_event
from inferchain.asgi import application

pytestmark = [pytest.mark.django_db(transaction=True)]


def communicator(user: Any) -> WebsocketCommunicator:
    comm = WebsocketCommunicator(LiveConsumer.as_asgi(), "/ws/live/")
    comm.scope["user"] = user
    return comm


async def test_anonymous_is_refused() -> None:
    comm = communicator(AnonymousUser())
    connected, code = await comm.connect()
    assert connected is False and code == 4401


async def test_fleet_events_reach_a_signed_in_user() -> None:
    user = await database_sync_to_async(User.objects.create)(username="w", role="viewer")
    comm = communicator(user)
    connected, _ = await comm.connect()
    assert connected
    await get_channel_layer().group_send(
        FLEET_GROUP, {"type": "live.event", "event": {"kind": "gpu", "v": 1}}
    )
    assert await comm.receive_json_from(timeout=3) == {"kind": "gpu", "v": 1}
    await comm.disconnect()


async def test_subscribe_to_a_host_group_and_reject_bad_names() -> None:
    user = await database_sync_to_async(User.objects.create)(username="w2", role="viewer")
    comm = communicator(user)
    await comm.connect()
    await comm.send_json_to({"subscribe": host_group("gpu-1")})
    assert await comm.receive_json_from(timeout=3) == {"type": "subscribed", "group": "live.host.gpu-1"}
    await database_sync_to_async(push_live_event)(host_group("gpu-1"), {"kind": "engine", "host": "gpu-1"})
    assert (await comm.receive_json_from(timeout=3))["host"] == "gpu-1"
    await comm.send_json_to({"subscribe": "other.group; drop"})
    assert (await comm.receive_json_from(timeout=3))["type"] == "error"
    await comm.send_json_to({"unsubscribe": host_group("gpu-1")})
    assert (await comm.receive_json_from(timeout=3))["type"] == "unsubscribed"
    await comm.disconnect()


async def test_full_asgi_stack_requires_a_session() -> None:
    comm = WebsocketCommunicator(
        application, "/ws/live/", headers=[(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]
    )
    connected, _ = await comm.connect()
    assert connected is False
