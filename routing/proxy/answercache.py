"""The response cache of a chain's `cache` stage: exact-match answers to deterministic requests, in Redis.

What it stores is the engine's answer assembled into its non-streamed form (a streamed answer's pieces
joined), so one entry answers a streamed and a non-streamed request alike (`replay_events` builds the
SSE chunks). The key names the tenant (a tenant never reads another's entry), the alias, the model
versions its pools serve now (a rollout to a new version misses) and the request in canonical JSON
without the fields that do not change the answer (`stream`, `stream_options`, `user`).

Per tenant, an index (sorted set: entry digest scored by its expiry) and a size table (hash: digest ->
bytes, plus the total) bound the tenant's entries and bytes; storing past a bound evicts the entries
nearest expiry (the oldest, under one TTL) in the same Lua call, so two proxies storing at once cannot
overshoot. Every key of a tenant shares the hash tag `{t<tenant id>}` (one slot on Redis Cluster).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

import orjson
import redis.asyncio as aioredis

from core.redis_client import key as rkey
from routing.proxy.config import RoutingSnapshot
from routing.proxy.stagespec import CACHE_DEFAULTS

# Request fields that change how the answer is delivered, not what it says.
UNKEYED = frozenset({"stream", "stream_options", "user"})
# Answer parts the replay cannot rebuild as a stream: such answers are not stored.
UNREPLAYABLE = ("tool_calls", "function_call", "audio")

STORE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local idx, sizes, base = KEYS[1], KEYS[2], ARGV[1]
local digest, value, ttl_ms = ARGV[2], ARGV[3], tonumber(ARGV[4])
local max_entries, max_bytes = tonumber(ARGV[5]), tonumber(ARGV[6])
local function forget(member)
  local size = tonumber(redis.call('HGET', sizes, member) or '0')
  redis.call('HDEL', sizes, member)
  redis.call('HINCRBY', sizes, '#total', -size)
end
for _, member in ipairs(redis.call('ZRANGEBYSCORE', idx, '-inf', now)) do forget(member) end
redis.call('ZREMRANGEBYSCORE', idx, '-inf', now)
if redis.call('ZSCORE', idx, digest) then forget(digest) end
redis.call('SET', base .. digest, value, 'PX', ttl_ms)
redis.call('ZADD', idx, now + ttl_ms, digest)
redis.call('HSET', sizes, digest, #value)
local total = redis.call('HINCRBY', sizes, '#total', #value)
local evicted = 0
while redis.call('ZCARD', idx) > max_entries or total > max_bytes do
  local oldest = redis.call('ZPOPMIN', idx)
  if not oldest[1] then break end
  forget(oldest[1])
  redis.call('DEL', base .. oldest[1])
  total = tonumber(redis.call('HGET', sizes, '#total') or '0')
  evicted = evicted + 1
end
local last = redis.call('ZRANGE', idx, -1, -1, 'WITHSCORES')
if last[2] then
  redis.call('PEXPIREAT', idx, last[2])
  redis.call('PEXPIREAT', sizes, last[2])
end
return evicted
"""


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """A cache stage's bounds (checked in routing/proxy/stagespec.py when the chain is saved)."""

    ttl_s: int
    max_entry_bytes: int
    max_entries: int
    max_bytes: int

    @classmethod
    def of(cls, config: dict[str, Any]) -> CacheConfig:
        return cls(**{k: int(config.get(k, default)) for k, default in CACHE_DEFAULTS.items()})


def deterministic(body: dict[str, Any]) -> bool:
    """Whether the request asks for a repeatable answer: temperature 0 or a seed, one choice."""
    if body.get("n") not in (None, 1):
        return False
    return body.get("temperature") == 0 or body.get("seed") is not None


def served_versions(snapshot: RoutingSnapshot, alias: str) -> str:
    """The model versions the alias's pools serve now (their own and any rollout candidate's), so a new
    version, or a rollout starting, makes every earlier entry miss."""
    versions: set[str] = set()
    for pool in snapshot.pools.values():
        if pool.alias != alias:
            continue
        versions.add("static" if pool.version_id is None else str(pool.version_id))
        if pool.canary is not None:
            versions.add(str(pool.canary.version_id))
    if not versions:
        model = snapshot.models.get(alias)
        versions.add("static" if model is None or model.version_id is None else str(model.version_id))
    return ",".join(sorted(versions))


def digest(kind: str, alias: str, versions: str, body: dict[str, Any]) -> str:
    """The entry's name: the request in canonical JSON (keys sorted, unkeyed fields left out)."""
    keyed = {k: v for k, v in body.items() if k not in UNKEYED}
    canonical = orjson.dumps([kind, alias, versions, keyed], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()


def tenant_base(tenant_id: int) -> str:
    return rkey("cache", f"{{t{tenant_id}}}", "")


async def lookup(client: aioredis.Redis, tenant_id: int, name: str) -> dict[str, Any] | None:
    """The stored answer, or None (raises on a Redis error: the caller fails open)."""
    raw = await client.get(tenant_base(tenant_id) + name)
    if raw is None:
        return None
    try:
        entry = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return entry if isinstance(entry, dict) and isinstance(entry.get("choices"), list) else None


class Store:
    """The Lua store script, registered once per process's client."""

    def __init__(self) -> None:
        self.scripts: dict[int, Any] = {}

    async def put(
        self, client: aioredis.Redis, tenant_id: int, name: str, value: bytes, cfg: CacheConfig
    ) -> int:
        """Store `value` under `name` for `cfg.ttl_s`; returns how many older entries were evicted."""
        script = self.scripts.get(id(client))
        if script is None:
            script = self.scripts[id(client)] = client.register_script(STORE_LUA)
        base = tenant_base(tenant_id)
        evicted = await script(
            keys=[base + "index", base + "sizes"],
            args=[base, name, value, cfg.ttl_s * 1000, cfg.max_entries, cfg.max_bytes],
        )
        return int(evicted)


class Recorder:
    """The engine's raw answer as it passes the relay, assembled into its non-streamed form."""

    __slots__ = ("broken", "choices", "head", "usage", "whole")

    def __init__(self) -> None:
        self.whole: dict[str, Any] | None = None
        self.head: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, Any] | None = None
        # Something the replay could not rebuild (tool calls, logprobs): the answer is not stored.
        self.broken = False

    def __call__(self, data: bytes) -> None:
        """A whole JSON answer, or a batch of SSE events of a streamed one."""
        if self.broken:
            return
        if not data.startswith(b"data:") and not data.startswith(b":"):
            try:
                parsed = orjson.loads(data)
            except orjson.JSONDecodeError:
                self.broken = True
                return
            if not isinstance(parsed, dict) or not replayable(parsed):
                self.broken = True
                return
            self.whole = parsed
            return
        for event in data.split(b"\n\n"):
            if event.startswith(b"data: {"):
                self._event(event[6:])

    def _event(self, raw: bytes) -> None:
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return
        if not isinstance(obj, dict):
            return
        if not self.head:
            self.head = {k: obj.get(k) for k in ("id", "model", "created", "system_fingerprint")}
            self.head["object"] = obj.get("object")
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        for n, choice in enumerate(obj.get("choices") or []):
            if not isinstance(choice, dict):
                continue
            if choice.get("logprobs") is not None:
                self.broken = True
                return
            index = choice.get("index", n)
            have = self.choices.setdefault(index, {"index": index, "text": [], "finish_reason": None})
            delta = choice.get("delta")
            if isinstance(delta, dict):
                if any(delta.get(part) for part in UNREPLAYABLE):
                    self.broken = True
                    return
                have["chat"] = True
                if isinstance(delta.get("content"), str):
                    have["text"].append(delta["content"])
            elif isinstance(choice.get("text"), str):
                have["text"].append(choice["text"])
            if choice.get("finish_reason") is not None:
                have["finish_reason"] = choice["finish_reason"]

    def answer(self, kind: str) -> dict[str, Any] | None:
        """The complete answer in its non-streamed form, or None (incomplete, or not replayable)."""
        if self.broken:
            return None
        if self.whole is not None:
            return self.whole
        if not self.choices or any(c["finish_reason"] is None for c in self.choices.values()):
            return None
        choices = []
        for index in sorted(self.choices):
            c = self.choices[index]
            text = "".join(c["text"])
            if kind == "chat":
                choices.append(
                    {
                        "index": index,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": c["finish_reason"],
                        "logprobs": None,
                    }
                )
            else:
                choices.append(
                    {"index": index, "text": text, "finish_reason": c["finish_reason"], "logprobs": None}
                )
        out = {
            **self.head,
            "object": "chat.completion" if kind == "chat" else "text_completion",
            "choices": choices,
        }
        if self.usage is not None:
            out["usage"] = self.usage
        return out


def replayable(answer: dict[str, Any]) -> bool:
    """Plain text choices only: what `replay_events` can rebuild as chunks."""
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices:
        return False
    for choice in choices:
        if not isinstance(choice, dict) or choice.get("logprobs") is not None:
            return False
        msg = choice.get("message")
        if isinstance(msg, dict):
            if any(msg.get(part) for part in UNREPLAYABLE) or not isinstance(msg.get("content"), str):
                return False
        elif not isinstance(choice.get("text"), str):
            return False
    return True


def replay_whole(answer: dict[str, Any], request_id: str, kind: str) -> dict[str, Any]:
    """The stored answer as this request's non-streamed answer (its own id and time)."""
    prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
    return {**answer, "id": prefix + request_id, "created": int(time.time())}


def replay_events(answer: dict[str, Any], request_id: str, kind: str, include_usage: bool) -> list[bytes]:
    """The stored answer as SSE events, as an engine streams it: for chat a role chunk, then per choice
    its text and its finish reason, the usage chunk when the client asked for it, then [DONE]."""
    chat = kind == "chat"
    head = {
        "id": ("chatcmpl-" if chat else "cmpl-") + request_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": answer.get("model"),
    }
    if answer.get("system_fingerprint"):
        head["system_fingerprint"] = answer["system_fingerprint"]
    events: list[bytes] = []

    def event(choices: list[dict[str, Any]], **extra: Any) -> None:
        events.append(b"data: " + orjson.dumps({**head, "choices": choices, **extra}) + b"\n\n")

    for n, choice in enumerate(answer["choices"]):
        index = choice.get("index", n)
        if chat:
            text = choice["message"]["content"]
            event([{"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
            if text:
                event([{"index": index, "delta": {"content": text}, "finish_reason": None}])
            event([{"index": index, "delta": {}, "finish_reason": choice.get("finish_reason") or "stop"}])
        else:
            if choice["text"]:
                event([{"index": index, "text": choice["text"], "finish_reason": None}])
            event([{"index": index, "text": "", "finish_reason": choice.get("finish_reason") or "stop"}])
    if include_usage and isinstance(answer.get("usage"), dict):
        event([], usage=answer["usage"])
    events.append(b"data: [DONE]\n\n")
    return events
