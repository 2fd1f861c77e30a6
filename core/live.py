"""Live events for browsers: the group names, and pushing to them from synchronous code (tasks, telemetry)."""

from __future__ import annotations

import re
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

FLEET_GROUP = "live.fleet"
GROUP_NAME = re.compile(r"^live\.[A-Za-z0-9_.\-]{1,90}$")


def host_group(host_name: str) -> str:
    return f"live.host.{host_name}"


def deployment_group(deployment_id: int) -> str:
    return f"live.deployment.{deployment_id}"


def push_live_event(group: str, event: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    async_to_sync(layer.group_send)(group, {"type": "live.event", "event": event})
