"""The live feed: one authenticated WebSocket that joins groups and forwards their events."""

from __future__ import annotations

from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from core.live import FLEET_GROUP, GROUP_NAME


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """Joins the fleet group on connect; `{"subscribe": g}` / `{"unsubscribe": g}` join or leave others.

    Producers call `channel_layer.group_send(group, {"type": "live.event", "event": {...}})`.
    """

    groups_joined: set[str]

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.groups_joined = set()
        await self.accept()
        await self._join(FLEET_GROUP)

    async def _join(self, group: str) -> None:
        await self.channel_layer.group_add(group, self.channel_name)
        self.groups_joined.add(group)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict):
            await self.send_json({"type": "error", "message": "Send a JSON object."})
            return
        for verb in ("subscribe", "unsubscribe"):
            group = content.get(verb)
            if group is None:
                continue
            if not isinstance(group, str) or not GROUP_NAME.match(group):
                await self.send_json({"type": "error", "message": f"Not a live group name: {group!r}"})
                return
            if verb == "subscribe":
                await self._join(group)
            else:
                await self.channel_layer.group_discard(group, self.channel_name)
                self.groups_joined.discard(group)
            await self.send_json({"type": f"{verb}d", "group": group})
            return
        await self.send_json(
            {"type": "error", "message": "Expected {'subscribe': group} or {'unsubscribe': group}."}
        )

    async def disconnect(self, code: int) -> None:
        for group in getattr(self, "groups_joined", set()):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def live_event(self, message: dict[str, Any]) -> None:
        await self.send_json(message["event"])
