"""What one agent sync's telemetry writes, for both paths that apply it (the full sync, the ingest).

The live record of each engine that still serves and the sample of each GPU the host has go to Redis
(one key each, with the live TTL) and to the hour of history (nodes/history.py); the same records go to
the console's live groups as events, where someone listens. All the Redis writes of a sync, and the
question "is anyone in these groups?", are one script call (`WRITE_SCRIPT`): one command to pack and
one round trip, where a pipeline of SET, XADD and EXPIRE per series cost the ingest about a third of
its CPU in redis-py's command packing (a host of 8 GPUs and 5 engines: 39 commands). The same call sets
the host's 10 s history point (nodes/tick_points.py), so the rollup tick need not rebuild it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from django.conf import settings

from core.live import FLEET_GROUP, deployment_group, group_key, host_group
from nodes import history, tick_points
from nodes.lifecycle import live_deployment_key, live_gpu_key

# Deployment states whose engine's live record is published: a crashed or stopped one's key must
# stay dropped (agent_channel.SUPERVISED_STATES).
LIVE_STATES = frozenset({"starting", "ready", "degraded"})

# KEYS: the live keys (ARGV[2..n+1] their records), then the history series (ARGV[n+2..] each's fields
# as a JSON list), then the hash of the 10 s bucket's host points (ARGV[n+m+2] the host, ARGV[n+m+3] its
# point), then the live groups' member sets. ARGV[1]: n, m, the live TTL, the trim point (stream ID),
# the history expiry ("" leaves it) and the points hash's expiry. Returns how many of the groups have
# members (EXISTS).
WRITE_SCRIPT = """
local h = cjson.decode(ARGV[1])
local n, m = tonumber(h.n), tonumber(h.m)
for i = 1, n do
  redis.call('SET', KEYS[i], ARGV[1 + i], 'EX', h.ttl)
end
for j = 1, m do
  local key = KEYS[n + j]
  redis.call('XADD', key, 'MINID', h.minid, '*', unpack(cjson.decode(ARGV[1 + n + j])))
  if h.keep ~= '' then
    redis.call('EXPIRE', key, h.keep)
  end
end
local points = KEYS[n + m + 1]
redis.call('HSET', points, ARGV[n + m + 2], ARGV[n + m + 3])
redis.call('EXPIRE', points, h.pkeep)
if #KEYS > n + m + 1 then
  return redis.call('EXISTS', unpack(KEYS, n + m + 2))
end
return 0
"""


@dataclass
class Telemetry:
    host: str
    engines: list[dict[str, Any]] = field(default_factory=list)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    event: dict[str, Any] = field(default_factory=dict)

    def script_call(self, groups: list[str], *, renew_history: bool = True) -> tuple[list[str], list[Any]]:
        """WRITE_SCRIPT's keys and arguments; `groups`: the member-set keys of the groups to ask about.

        `renew_history=False` leaves each series' expiry as it is, for a writer sure that another renews it
        well within NODE_HISTORY_SECONDS (the ingest: its host's full syncs come every few minutes)."""
        live_keys = [live_deployment_key(live["deployment_id"]) for live in self.engines]
        live_keys += [live_gpu_key(self.host, sample["index"]) for sample in self.gpus]
        records = [orjson.dumps(r) for r in (*self.engines, *self.gpus)]
        series = [history.engine_series_key(int(live["deployment_id"])) for live in self.engines]
        series += [history.gpu_series_key(self.host, int(sample["index"])) for sample in self.gpus]
        fields = [_flat(history.encode(live, history.ENGINE_FIELDS)) for live in self.engines]
        fields += [_flat(history.encode(sample, history.GPU_FIELDS)) for sample in self.gpus]
        keep = history.history_seconds()
        now = time.time()
        head = {
            "n": len(live_keys),
            "m": len(series),
            "ttl": str(max(1, round(settings.NODE_LIVE_TTL_SECONDS))),
            "minid": str(int((now - keep) * 1000)),
            "keep": str(max(1, math.ceil(keep))) if renew_history else "",
            "pkeep": str(tick_points.KEEP_SECONDS),
        }
        points = tick_points.bucket_key(tick_points.bucket_of(now))
        point = tick_points.host_point(self.gpus, self.engines)
        keys = [*live_keys, *series, points, *groups]
        return keys, [orjson.dumps(head), *records, *fields, self.host, point]

    def sends(self) -> list[tuple[str, dict[str, Any]]]:
        """The console's live events: one per engine to its deployment's group, the host's to two."""
        out: list[tuple[str, dict[str, Any]]] = [
            (deployment_group(live["deployment_id"]), {"type": "deployment.metrics", **live})
            for live in self.engines
        ]
        return [*out, (FLEET_GROUP, self.event), (host_group(self.host), self.event)]


def telemetry(
    host: str,
    deployments: dict[int, tuple[str, str]],
    gpu_indices: set[int],
    engines: list[dict[str, Any]],
    gpus: list[dict[str, Any]],
    info: dict[str, Any],
) -> Telemetry:
    """One sync's telemetry, kept to what is the host's: `deployments` maps id -> (name, state)."""
    out = Telemetry(host)
    for record in engines:
        try:
            deployment_id = int(record.get("deployment_id", -1))
        except (TypeError, ValueError):
            continue
        known = deployments.get(deployment_id)
        if known is None or known[1] not in LIVE_STATES:
            continue
        out.engines.append(
            {**record, "deployment_id": deployment_id, "host": host, "name": known[0], "state": known[1]}
        )
    out.gpus = [s for s in gpus if isinstance(s.get("index"), int) and s["index"] in gpu_indices]
    out.event = {
        "type": "host.telemetry",
        "host": host,
        "ts": out.gpus[0]["ts"] if out.gpus and "ts" in out.gpus[0] else time.time(),
        "simulated": bool(info.get("simulated_gpus", False)),
        "gpu_note": info.get("gpu_note", ""),
        "gpus": out.gpus,
        "engines": out.engines,
    }
    return out


def member_keys(sends: list[tuple[str, dict[str, Any]]]) -> list[str] | None:
    """The member-set keys of the groups `sends` go to, or None when the channel layer keeps none."""
    found = [group_key(group) for group, _ in sends]
    return None if any(k is None for k in found) else [k for k in found if k is not None]


def _flat(fields: dict[Any, Any]) -> bytes:
    return orjson.dumps([str(x) for pair in fields.items() for x in pair])
