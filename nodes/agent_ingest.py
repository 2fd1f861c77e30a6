"""The agent channel's front door: routine syncs answered in the event loop, the rest handed to Django.

`POST /api/agent/sync/` reaches this app first (inferchain/asgi.py). It reads the body (at most
AGENT_SYNC_MAX_BYTES, within AGENT_SYNC_BODY_SECONDS: a slow or hostile agent holds neither memory
nor a worker), and answers it here when it is routine: no queued change, no GPU inventory, no Ray
report, and the host's sync snapshot (nodes/agent_generation.py) still stands for the generation the
agent echoes, the token it sends and the info it reports. Then the sync costs one MGET, one pipeline
of telemetry writes (nodes/agent_telemetry.py), the console's live events, and no PostgreSQL at all:
the heartbeat becomes a lease written for many hosts in one UPDATE, at most once per
NODE_HEARTBEAT_SECONDS each (`Leases`). The answer says `unchanged`: the agent keeps the deployments
it was last told.

Anything else (a change to apply, a first sync, a stale or missing snapshot, a body this path does not
recognise) goes to Django's view (nodes/api/agent_views.py) with the body it sent, unchanged, where the
token is checked against the database and a malformed batch gets its 400 naming the field.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from django.conf import settings
from django.utils import timezone
from redis.exceptions import RedisError

from core.live import send_live_events
from core.redis_client import async_redis
from nodes import agent_generation, agent_telemetry
from nodes.agent_tokens import hash_agent_token

log = logging.getLogger("nodes.agent_ingest")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[..., Awaitable[None]]

SYNC_PATH = "/api/agent/sync/"
# The keys a routine batch may hold; any other goes the full path (whose serializer names it).
ROUTINE_KEYS = frozenset(
    {"host", "info", "gpus", "engines", "changes", "gpu_inventory", "ray_nodes", "generation"}
)
MAX_GPUS = 64
MAX_ENGINES = 1000
# A host this process has not answered for this long is forgotten by its lease writer.
QUIET_SECONDS = 60.0


class Leases:
    """Heartbeats of the hosts this process answered, written to their rows in one UPDATE per round.

    A host's row gets a fresh `last_heartbeat` at most once per NODE_HEARTBEAT_SECONDS (what the
    unreachable sweep needs), and only while it is online or draining: one that the sweep marked
    unreachable moved its generation, so its next sync is a full one and brings it back itself.
    """

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}
        self.written: dict[str, float] = {}
        self.task: asyncio.Task[None] | None = None

    def saw(self, host: str, written_at: float) -> None:
        now = time.time()
        self.seen[host] = now
        self.written[host] = max(self.written.get(host, 0.0), written_at)
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        period = max(0.2, settings.NODE_HEARTBEAT_SECONDS / 4)
        while self.seen:
            await asyncio.sleep(period)
            await self.flush()

    async def flush(self) -> None:
        now = time.time()
        period = settings.NODE_HEARTBEAT_SECONDS
        for host in [h for h, seen in self.seen.items() if now - seen > QUIET_SECONDS]:
            # Gone quiet: its next routine sync, if any, starts over from its snapshot.
            del self.seen[host]
            self.written.pop(host, None)
        due = [h for h, seen in self.seen.items() if seen - self.written[h] >= period]
        if not due:
            return
        try:
            await asyncio.to_thread(write_leases, due)
        except Exception as exc:  # the sweep may mark them unreachable; their next full sync heals it
            log.warning("could not write the heartbeat of %d host(s): %s", len(due), exc)
            return
        for host in due:
            self.written[host] = now


def write_leases(host_names: list[str]) -> int:
    from django.db import close_old_connections

    from nodes.choices import HostState
    from nodes.models import Host

    # A worker thread has no request cycle: its connection follows DB_CONN_MAX_AGE here, on both sides.
    close_old_connections()
    try:
        return (
            Host.objects.filter(name__in=host_names)
            .exclude(state__in=[HostState.UNKNOWN, HostState.UNREACHABLE])
            .update(last_heartbeat=timezone.now())
        )
    finally:
        close_old_connections()


class AgentIngest:
    def __init__(self, full_path: ASGIApp) -> None:
        self.full_path = full_path
        self.leases = Leases()
        self._redis: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._write: Any = None
        self._full = asyncio.Semaphore(1)  # replaced per event loop, in redis()
        self.answered = 0  # routine syncs answered here (a test and the benchmark read it)

    def redis(self) -> Any:
        # An asyncio client belongs to the loop it first ran in (one per uvicorn worker; tests run several).
        loop = asyncio.get_running_loop()
        if self._redis is None or self._loop is not loop:
            self._redis = async_redis(settings.REDIS_URL, link="ingest", socket_timeout=2, max_connections=32)
            self._full = asyncio.Semaphore(settings.AGENT_FULL_SYNCS)
            self._write = self._redis.register_script(agent_telemetry.WRITE_SCRIPT)
            self._loop = loop
        return self._redis

    async def script(self, *, keys: list[str], args: list[Any]) -> int:
        """WRITE_SCRIPT by its digest (loaded on first use, and again after a Redis restart)."""
        self.redis()
        return int(await self._write(keys=keys, args=args))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        limit = settings.AGENT_SYNC_MAX_BYTES
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            await _error(
                send,
                413,
                "sync_too_large",
                f"A sync body may be at most {limit} bytes; this one says {length}.",
            )
            return
        try:
            async with asyncio.timeout(settings.AGENT_SYNC_BODY_SECONDS):
                body = await _read_body(receive, limit)
        except TimeoutError:
            await _error(
                send,
                408,
                "sync_body_timeout",
                f"The sync body did not arrive within {settings.AGENT_SYNC_BODY_SECONDS:g} s; send it whole.",
            )
            return
        except _TooLarge:
            await _error(send, 413, "sync_too_large", f"A sync body may be at most {limit} bytes.")
            return
        except _Disconnected:
            return
        try:
            answer = await self.routine(body, headers.get("authorization", ""))
        except RedisError:  # Redis down: its loss is logged once (core.redis_client); the full path answers
            answer = None
        except Exception:  # this path is an optimisation: the full path answers whatever it cannot
            log.exception("routine sync failed; answering it the full way")
            answer = None
        if answer is not None:
            self.answered += 1
            await _json(send, 200, orjson.dumps(answer))
            return
        # At most AGENT_FULL_SYNCS full syncs at once in this worker, the others wait their turn: Django
        # runs each in a thread of its own with its own database connection, and a burst of hundreds
        # (every agent after a restart of the control plane) would take every PostgreSQL connection.
        self.redis()
        async with self._full:
            await self.full_path(scope, _replay(body, receive), send)

    async def routine(self, body: bytes, authorization: str) -> dict[str, Any] | None:
        """The answer to a routine sync, or None for one the full path must take."""
        try:
            batch = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(batch, dict) or set(batch) - ROUTINE_KEYS:
            return None
        host, generation = batch.get("host"), batch.get("generation")
        info, gpus, engines = batch.get("info", {}), batch.get("gpus", []), batch.get("engines", [])
        if (
            not isinstance(host, str)
            or not 0 < len(host) <= 63
            or type(generation) is not int
            or batch.get("changes")
            or batch.get("gpu_inventory") is not None
            or batch.get("ray_nodes")
            or not isinstance(info, dict)
            or not _records(gpus, MAX_GPUS)
            or not _records(engines, MAX_ENGINES)
        ):
            return None
        raw = authorization[7:].strip() if authorization.lower().startswith("bearer ") else ""
        if not raw:
            return None
        found, current = await self.redis().mget(
            [agent_generation.snapshot_key(host), agent_generation.generation_key(host)]
        )
        if found is None:
            return None
        snapshot = orjson.loads(found)
        if (
            snapshot["generation"] != int(current or 0)
            or snapshot["generation"] != generation
            or not hmac.compare_digest(str(snapshot["token"]), hash_agent_token(raw))
            or snapshot["info"] != {**info, "channel": "api"}
            or time.time() >= float(snapshot["due"])
        ):
            return None
        known = {int(pk): (name, state) for pk, (name, state) in snapshot["deployments"].items()}
        out = agent_telemetry.telemetry(host, known, set(snapshot["gpus"]), engines, gpus, info)
        if not _numeric(out.gpus, "ts") or not _numeric(out.engines, "ts"):
            return None  # the full path answers a sample it cannot keep
        sends = out.sends()
        # Whether anyone listens is asked in the same call: most syncs have no browser on any of their
        # groups, and a group_send costs two round trips even then.
        groups = agent_telemetry.member_keys(sends)
        # A full sync of the host comes at least every AGENT_SNAPSHOT_SECONDS and renews the history's
        # expiry; here it is left alone unless the history is kept for less than two of those.
        renew = settings.NODE_HISTORY_SECONDS <= 2 * settings.AGENT_SNAPSHOT_SECONDS
        keys, args = out.script_call(groups or [], renew_history=renew)
        listening = await self.script(keys=keys, args=args)
        if groups is not None and not listening:
            sends = []
        self.leases.saw(host, float(snapshot["heartbeat_at"]))
        for group, exc in await send_live_events(sends):
            log.warning("live push to %s failed: %s", group, exc)
        return {"acked": [], "generation": generation, "unchanged": True}


def _records(value: Any, most: int) -> bool:
    return isinstance(value, list) and len(value) <= most and all(isinstance(r, dict) for r in value)


def _numeric(records: list[dict[str, Any]], name: str) -> bool:
    return all(isinstance(r.get(name), int | float) and not isinstance(r.get(name), bool) for r in records)


class _TooLarge(Exception):
    pass


class _Disconnected(Exception):
    pass


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the already-read body to the next app once, then the connection's own."""
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _error(send: Send, status: int, code: str, message: str) -> None:
    await _json(send, status, json.dumps({"error": {"code": code, "message": message}}).encode())


async def _json(send: Send, status: int, data: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})
