"""Admission control shared by every proxy process: one Lua call per admission, completions folded in.

Per scope (the tenant, and the key when it has an override quota):
- requests/minute: sliding-window log (sorted set of request ids scored by admission time);
- tokens/minute: sliding-window log of reservations `id:tokens` plus a running sum; admission reserves
  prompt + max output tokens, completion rewrites the entry to the tokens actually used (the refund);
- concurrency: leases (sorted set scored by expiry) renewed while the request runs, so a dead proxy's
  leases lapse within `LEASE_MS`;
- daily token budget: a per-UTC-day counter, reserved and reconciled the same way.
Time comes from Redis (`TIME`, inside the script) so that processes with skewed clocks agree.

Cost: the scripts go over `RedisPipe` (routing/proxy/redispipe.py), one pipelined socket per process
whose commands queued in one loop iteration leave in one write; each key's constant part of both
commands (digest, keys, limits) is packed once. A completion is not sent on its own: it is queued
and runs at the start of this process's next admission script (so one script call per request, and
that admission already sees the refund and the released lease), or, if no admission comes within
`FINISH_DELAY_S`, leaves by itself without a reply (a failure could not be acted on anyway: the lease
lapses by itself). Clients that the pipe cannot speak for (TLS) use redis-py, one call each.

A key a process admits back to back does not cost a script call per request at all: the admission's
script also grants the process an allowance (units of every limit set aside for it and counted in Redis
at once) that it spends locally for at most `allowance_ms`, then settles (docs/proxy.md, "Allowances").
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from core.redis_client import key as rkey
from routing.proxy.config import KeyInfo, Limits
from routing.proxy.errors import rate_limited, unavailable
from routing.proxy.redispipe import RedisPipe, Script, bulk, lean_params

WINDOW_MS = 60_000
LEASE_MS = 30_000
KEYS_PER_SCOPE = 5

ADMIT_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id = ARGV[1]
local reserve = tonumber(ARGV[2])
local lease_ms = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local to_midnight_ms = tonumber(ARGV[5])
local window = 60000
local ga = 5 + n * 4
local keep_ms = window + tonumber(ARGV[ga + 5])
local best_req_limit, best_req_left, best_tok_limit, best_tok_left = -1, -1, -1, -1
-- What is left under each kind of limit after this request, the least over the scopes (for a grant).
local room_req, room_tok, room_conc = math.huge, math.huge, math.huge
local function tokens_of(member) return tonumber(string.match(member, ':(%d+)$')) end
for i = 0, n - 1 do
  local kb = i * 5
  local ab = 5 + i * 4
  local rpm = tonumber(ARGV[ab + 1])
  local tpm = tonumber(ARGV[ab + 2])
  local conc = tonumber(ARGV[ab + 3])
  local budget = tonumber(ARGV[ab + 4])
  if rpm >= 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[kb + 1], '-inf', now - window)
    local used = redis.call('ZCARD', KEYS[kb + 1])
    if used + 1 > rpm then
      local oldest = redis.call('ZRANGE', KEYS[kb + 1], 0, 0, 'WITHSCORES')
      local retry = window
      if oldest[2] then retry = tonumber(oldest[2]) + window - now end
      return {0, i, 'requests', retry, rpm, 0, tpm, -1}
    end
    if best_req_left < 0 or rpm - used - 1 < best_req_left then
      best_req_limit = rpm
      best_req_left = rpm - used - 1
    end
    room_req = math.min(room_req, rpm - used - 1)
  end
  if tpm >= 0 then
    local old = redis.call('ZRANGEBYSCORE', KEYS[kb + 2], '-inf', now - window)
    if #old > 0 then
      local gone = 0
      for _, m in ipairs(old) do gone = gone + tokens_of(m) end
      redis.call('ZREMRANGEBYSCORE', KEYS[kb + 2], '-inf', now - window)
      redis.call('DECRBY', KEYS[kb + 3], gone)
    end
    local used = tonumber(redis.call('GET', KEYS[kb + 3]) or '0')
    if reserve > tpm then
      return {0, i, 'tokens_request', -1, rpm, -1, tpm, tpm - used}
    end
    if used + reserve > tpm then
      local need = used + reserve - tpm
      local freed = 0
      local retry = window
      local entries = redis.call('ZRANGE', KEYS[kb + 2], 0, -1, 'WITHSCORES')
      for j = 1, #entries, 2 do
        freed = freed + tokens_of(entries[j])
        if freed >= need then
          retry = tonumber(entries[j + 1]) + window - now
          break
        end
      end
      return {0, i, 'tokens', retry, rpm, -1, tpm, tpm - used}
    end
    if best_tok_left < 0 or tpm - used - reserve < best_tok_left then
      best_tok_limit = tpm
      best_tok_left = tpm - used - reserve
    end
    room_tok = math.min(room_tok, tpm - used - reserve)
  end
  if conc >= 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[kb + 4], '-inf', now)
    local live = redis.call('ZCARD', KEYS[kb + 4])
    if live >= conc then
      return {0, i, 'concurrency', 1000, rpm, -1, tpm, -1}
    end
    room_conc = math.min(room_conc, conc - live - 1)
  end
  if budget >= 0 then
    local used = tonumber(redis.call('GET', KEYS[kb + 5]) or '0')
    if used + reserve > budget then
      return {0, i, 'budget', to_midnight_ms, rpm, -1, tpm, -1}
    end
    room_tok = math.min(room_tok, budget - used - reserve)
  end
end
-- The allowance (ARGV[ga + 1..6]: its id, the requests, tokens and concurrent requests asked for, how
-- long it may admit for, and the share of what is left a grant may take): units of every limit set
-- aside for this process, counted here now as if used, so that nobody else can have them. Requests and
-- tokens are scored at the end of its term, the latest time any of them can be used, so that each stays
-- in the window at least 60 s after its use. None when a limit has too little left to share.
local grant_req = tonumber(ARGV[ga + 2])
local grant_tok, grant_conc = tonumber(ARGV[ga + 3]), tonumber(ARGV[ga + 4])
if grant_req > 0 then
  local share = tonumber(ARGV[ga + 6])
  grant_req = math.min(grant_req, math.floor(room_req / share))
  grant_tok = math.min(grant_tok, math.floor(room_tok / share))
  grant_conc = math.min(grant_conc, math.floor(room_conc / share))
  if grant_req < 2 or grant_tok < math.max(reserve, 1) or grant_conc < 1 then
    grant_req, grant_tok, grant_conc = 0, 0, 0
  end
end
local aid = ARGV[ga + 1]
local term_end = now + tonumber(ARGV[ga + 5])
-- One ZADD of all of an allowance's members per key (score, member, score, member, ...).
local req_members, conc_members = {}, {}
for j = 1, grant_req do
  req_members[2 * j - 1] = term_end
  req_members[2 * j] = aid .. '#' .. j
end
for j = 1, (grant_req > 0 and grant_conc or 0) do
  conc_members[2 * j - 1] = now + lease_ms
  conc_members[2 * j] = aid .. '#c' .. j
end
for i = 0, n - 1 do
  local kb = i * 5
  local ab = 5 + i * 4
  if tonumber(ARGV[ab + 1]) >= 0 then
    redis.call('ZADD', KEYS[kb + 1], now, id)
    if grant_req > 0 then redis.call('ZADD', KEYS[kb + 1], unpack(req_members)) end
    redis.call('PEXPIRE', KEYS[kb + 1], keep_ms)
  end
  if tonumber(ARGV[ab + 2]) >= 0 then
    -- NX, and the sum only for an entry new here: a command the pipe resent after a lost reply (it ran
    -- once already) must not add its tokens to the running sum a second time, which would stay there.
    if redis.call('ZADD', KEYS[kb + 2], 'NX', now, id .. ':' .. reserve) == 1 then
      redis.call('INCRBY', KEYS[kb + 3], reserve)
    end
    if grant_req > 0 and redis.call('ZADD', KEYS[kb + 2], 'NX', term_end, aid .. ':' .. grant_tok) == 1 then
      redis.call('INCRBY', KEYS[kb + 3], grant_tok)
    end
    redis.call('PEXPIRE', KEYS[kb + 2], keep_ms)
    redis.call('PEXPIRE', KEYS[kb + 3], keep_ms)
  end
  if tonumber(ARGV[ab + 3]) >= 0 then
    redis.call('ZADD', KEYS[kb + 4], now + lease_ms, id)
    if grant_req > 0 then redis.call('ZADD', KEYS[kb + 4], unpack(conc_members)) end
    redis.call('PEXPIRE', KEYS[kb + 4], lease_ms * 2)
  end
  if tonumber(ARGV[ab + 4]) >= 0 then
    redis.call('INCRBY', KEYS[kb + 5], reserve + (grant_req > 0 and grant_tok or 0))
    redis.call('PEXPIRE', KEYS[kb + 5], to_midnight_ms + 3600000)
  end
end
if grant_req == 0 then grant_tok, grant_conc = 0, 0 end
return {
  1, -1, '', 0, best_req_limit, best_req_left, best_tok_limit, best_tok_left, grant_req, grant_tok, grant_conc
}
"""

# One completion against one limit: its keys from KEYS[kb + 2] and flags from ARGV[ab + 2] (tokens, lease,
# budget). The token reservation is corrected to what was used, the lease released, the budget corrected.
FINISH_ONE_LUA = """
local function finish_one(id, reserved, actual, kb, ab)
  if tonumber(ARGV[ab + 2]) >= 0 then
    local member = id .. ':' .. reserved
    local score = redis.call('ZSCORE', KEYS[kb + 2], member)
    -- A reservation that already left the window has nothing left to correct.
    if score then
      redis.call('ZREM', KEYS[kb + 2], member)
      redis.call('ZADD', KEYS[kb + 2], score, id .. ':' .. actual)
      redis.call('INCRBY', KEYS[kb + 3], actual - reserved)
    end
  end
  if tonumber(ARGV[ab + 3]) >= 0 then
    redis.call('ZREM', KEYS[kb + 4], id)
  end
  if tonumber(ARGV[ab + 4]) >= 0 and redis.call('EXISTS', KEYS[kb + 5]) == 1 then
    redis.call('INCRBY', KEYS[kb + 5], actual - reserved)
  end
end
"""

FINISH_LUA = (
    FINISH_ONE_LUA
    + """
local id = ARGV[1]
local reserved = tonumber(ARGV[2])
local actual = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
for i = 0, n - 1 do
  finish_one(id, reserved, actual, i * 5, 4 + i * 4)
end
return 1
"""
)

# Completions queued in this process run at the start of its next admission's script (FOLDED_ADMIT_LUA),
# one script run per request instead of two: finish_one for each, reading its KEYS and ARGV after the
# admission's own (m completions, then for each: id, reserved, actual, n, limits; their keys in order).
FINISHES_PRELUDE_LUA = """
do
  local fa = 5 + 4 * tonumber(ARGV[4]) + 6
  local ki = 5 * tonumber(ARGV[4])
  local m = tonumber(ARGV[fa + 1])
  local ai = fa + 2
  for _ = 1, m do
    local fid = ARGV[ai]
    local reserved = tonumber(ARGV[ai + 1])
    local actual = tonumber(ARGV[ai + 2])
    local fn = tonumber(ARGV[ai + 3])
    for i = 0, fn - 1 do
      finish_one(fid, reserved, actual, ki + i * 5, ai + 3 + i * 4)
    end
    ai = ai + 4 + 4 * fn
    ki = ki + 5 * fn
  end
end
"""
FOLDED_ADMIT_LUA = FINISH_ONE_LUA + FINISHES_PRELUDE_LUA + ADMIT_LUA

# The end of an allowance: what it set aside and did not use goes back; the tokens of its finished requests
# stay as one entry (their actual use); each request still running becomes an ordinary admission (its own
# token reservation, its own lease), so that its completion and lease renewals work as for any request.
# ARGV: the allowance's id, n, limits..., then: requests granted, requests used, tokens granted, tokens
# used by finished requests, concurrent requests granted, lease ms, m running, then m x (id, reserved).
SETTLE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local aid = ARGV[1]
local n = tonumber(ARGV[2])
local sa = 2 + 4 * n
local granted_req, used_req = tonumber(ARGV[sa + 1]), tonumber(ARGV[sa + 2])
local granted_tok, spent = tonumber(ARGV[sa + 3]), tonumber(ARGV[sa + 4])
local granted_conc, lease_ms, m = tonumber(ARGV[sa + 5]), tonumber(ARGV[sa + 6]), tonumber(ARGV[sa + 7])
local held = 0
for r = 1, m do held = held + tonumber(ARGV[sa + 7 + 2 * r]) end
local unused, slots, leases = {}, {}, {}
for j = used_req + 1, granted_req do unused[#unused + 1] = aid .. '#' .. j end
for j = 1, granted_conc do slots[j] = aid .. '#c' .. j end
for r = 1, m do
  leases[2 * r - 1] = now + lease_ms
  leases[2 * r] = ARGV[sa + 6 + 2 * r]
end
for i = 0, n - 1 do
  local kb = i * 5
  local ab = 2 + i * 4
  if tonumber(ARGV[ab + 1]) >= 0 and #unused > 0 then
    redis.call('ZREM', KEYS[kb + 1], unpack(unused))
  end
  if tonumber(ARGV[ab + 2]) >= 0 then
    local member = aid .. ':' .. granted_tok
    local score = redis.call('ZSCORE', KEYS[kb + 2], member)
    -- Gone only after a Redis restart (it cannot have left the window yet): then nothing to correct.
    if score then
      redis.call('ZREM', KEYS[kb + 2], member)
      if spent > 0 then redis.call('ZADD', KEYS[kb + 2], score, aid .. ':' .. spent) end
      for r = 1, m do
        redis.call('ZADD', KEYS[kb + 2], score, ARGV[sa + 6 + 2 * r] .. ':' .. ARGV[sa + 7 + 2 * r])
      end
      redis.call('INCRBY', KEYS[kb + 3], spent + held - granted_tok)
    end
  end
  if tonumber(ARGV[ab + 3]) >= 0 then
    if #slots > 0 then redis.call('ZREM', KEYS[kb + 4], unpack(slots)) end
    if m > 0 then redis.call('ZADD', KEYS[kb + 4], unpack(leases)) end
  end
  if tonumber(ARGV[ab + 4]) >= 0 and redis.call('EXISTS', KEYS[kb + 5]) == 1 then
    redis.call('INCRBY', KEYS[kb + 5], spent + held - granted_tok)
  end
end
return 1
"""

RENEW_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease_ms = tonumber(ARGV[1])
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], 'XX', now + lease_ms, ARGV[i + 1])
  redis.call('PEXPIRE', KEYS[i], lease_ms * 2)
end
return #KEYS
"""


@dataclass(slots=True)
class Admission:
    """A request admitted by the limiter: what to reconcile and release when it finishes."""

    request_id: str
    reserved: int
    keys: list[str] = field(default_factory=list)
    limit_args: list[int] = field(default_factory=list)
    lease_keys: list[str] = field(default_factory=list)
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    plan: _Plan | None = None
    # Admitted out of this process's allowance, not yet settled: its completion stays in the process.
    allowance: _Allowance | None = None


class _Allowance:
    """Units of every limit of one plan that Redis set aside for this process in one admission's script
    (ADMIT_LUA), spent here without a round trip until its term ends or they run out, then settled
    (SETTLE_LUA): what was not used goes back, requests still running become ordinary admissions."""

    __slots__ = (
        "aid",
        "granted_requests",
        "granted_slots",
        "granted_tokens",
        "plan",
        "req_left",
        "req_limit",
        "req_limit_b",
        "requests",
        "retired",
        "running",
        "settled",
        "slots",
        "spent",
        "timer",
        "tok_left",
        "tok_limit",
        "tok_limit_b",
        "tokens",
        "until",
    )

    def __init__(
        self, aid: bytes, plan: _Plan, until: float, granted: tuple[int, int, int], limits: tuple[int, ...]
    ) -> None:
        self.aid = aid
        self.plan = plan
        self.until = until  # the event loop's clock; Redis's term ends no earlier
        self.granted_requests, self.granted_tokens, self.granted_slots = granted
        self.requests, self.tokens, self.slots = granted  # what is left to spend
        self.req_limit, self.req_left, self.tok_limit, self.tok_left = limits  # as of the grant
        self.req_limit_b, self.tok_limit_b = b"%d" % self.req_limit, b"%d" % self.tok_limit
        self.spent = 0  # tokens used by the requests it admitted that have finished
        self.running: dict[str, Admission] = {}
        self.settled = False
        self.retired = False  # admits nothing more; settled when the last request it admitted finishes
        self.timer: asyncio.TimerHandle | None = None


class _Plan:
    """One key's limiter commands with everything but the per-request values packed (for one UTC day),
    and this process's demand and allowance under them."""

    __slots__ = (
        "admit_mid",
        "admit_nargs",
        "admit_tail",
        "allowance",
        "asking",
        "avg_reserve",
        "day",
        "finish_head",
        "finish_nargs",
        "finish_tail",
        "granting",
        "keys",
        "keys_only",
        "keys_part",
        "lease_keys",
        "limit_args",
        "n",
        "peak",
        "peak_before",
        "refused",
        "running",
        "seen",
        "seen_before",
        "seen_since",
        "settle_head",
        "settle_tail",
    )

    def __init__(self, scopes: list[tuple[str, Limits]], day: str, lease_ms: int) -> None:
        self.day = day
        self.keys: list[str] = []
        self.limit_args: list[int] = []
        self.lease_keys: list[str] = []
        for name, lim in scopes:
            self.keys += [
                rkey("rl", name, "rpm"),
                rkey("rl", name, "tpm"),
                rkey("rl", name, "tpm_sum"),
                rkey("rl", name, "conc"),
                budget_key(name, day),
            ]
            self.limit_args += [
                _arg(lim.requests_per_minute),
                _arg(lim.tokens_per_minute),
                _arg(lim.max_concurrent_requests),
                _arg(lim.daily_token_budget),
            ]
            if lim.max_concurrent_requests is not None:
                self.lease_keys.append(rkey("rl", name, "conc"))
        self.n = len(scopes)
        # EVALSHA digest numkeys KEYS... then ADMIT_LUA's ARGV: id, reserve, lease_ms, n, to_midnight,
        # limits..., the allowance's six; FINISH_LUA's: id, reserved, actual, n, limits...
        self.keys_only = b"".join(bulk(k.encode()) for k in self.keys)
        self.keys_part = bulk(b"%d" % len(self.keys)) + self.keys_only
        limits = b"".join(bulk(b"%d" % v) for v in self.limit_args)
        self.admit_mid = bulk(b"%d" % lease_ms) + bulk(b"%d" % self.n)
        self.admit_tail = limits
        self.finish_tail = bulk(b"%d" % self.n) + limits
        self.admit_nargs = 1 + len(self.keys) + 5 + len(self.limit_args) + GRANT_ARGS
        self.finish_nargs = 1 + len(self.keys) + 4 + len(self.limit_args)
        # By source, not digest: a completion gets no reply, so a NOSCRIPT could not be seen and retried.
        self.finish_head = FINISH_SCRIPT.head(self.finish_nargs, by_digest=False) + self.keys_part
        self.settle_head = self.keys_part
        self.settle_tail = bulk(b"%d" % self.n) + limits
        # This process's traffic under the plan: admissions in the current and the previous allowance
        # term (what an ask is sized by), requests running, the mean reservation.
        self.seen = 0
        self.seen_before = 0
        self.peak = 0  # the most running at once in the current term, and in the one before
        self.peak_before = 0
        self.seen_since = -math.inf
        self.running = 0
        self.avg_reserve = 0.0
        self.allowance: _Allowance | None = None
        # Done when the admission asking for an allowance has its answer (None: none is on its way).
        self.asking: asyncio.Future[None] | None = None
        self.refused: _Allowance | None = None  # the allowance open when an ask was last refused
        self.granting = False  # whether the last ask was granted


def _scopes(info: KeyInfo) -> list[tuple[str, Limits]]:
    scopes: list[tuple[str, Limits]] = []
    if info.tenant_limits.counted:
        scopes.append((tenant_scope(info.tenant_id), info.tenant_limits))
    if info.key_limits.counted:
        scopes.append((f"k{info.id}", info.key_limits))
    return scopes


def budget_key(scope: str, day: str) -> str:
    """Tokens used by a scope (`t<tenant id>` or `k<key id>`) on a UTC day (`YYYYMMDD`); the fleet
    exposition reads the tenants' ones for the near-budget alert."""
    return rkey("rl", scope, "budget", day)


def tenant_scope(tenant_id: int) -> str:
    return f"t{tenant_id}"


def _arg(v: int | None) -> int:
    return -1 if v is None else int(v)


_MESSAGES = {
    "requests": ("Rate limit reached: requests per minute.", "rate_limit_exceeded"),
    "tokens": ("Rate limit reached: tokens per minute.", "rate_limit_exceeded"),
    "tokens_request": (
        "This request alone needs more tokens than the tokens-per-minute limit; lower max_tokens.",
        "tokens_exceeded",
    ),
    "concurrency": ("Too many concurrent requests for this tenant or key.", "concurrency_limit_exceeded"),
    "budget": ("Daily token budget exhausted; it resets at 00:00 UTC.", "insufficient_quota"),
}


def _header_list(req_limit: int, req_left: int, tok_limit: int, tok_left: int) -> list[tuple[bytes, bytes]]:
    headers: list[tuple[bytes, bytes]] = []
    if req_limit >= 0:
        headers.append((b"x-ratelimit-limit-requests", str(req_limit).encode()))
        headers.append((b"x-ratelimit-remaining-requests", str(max(req_left, 0)).encode()))
    if tok_limit >= 0:
        headers.append((b"x-ratelimit-limit-tokens", str(tok_limit).encode()))
        headers.append((b"x-ratelimit-remaining-tokens", str(max(tok_left, 0)).encode()))
    return headers


_LIMIT_REQUESTS, _LEFT_REQUESTS = b"x-ratelimit-limit-requests", b"x-ratelimit-remaining-requests"
_LIMIT_TOKENS, _LEFT_TOKENS = b"x-ratelimit-limit-tokens", b"x-ratelimit-remaining-tokens"


ADMIT_SCRIPT = Script(ADMIT_LUA)
FINISH_SCRIPT = Script(FINISH_LUA)
FOLDED_ADMIT_SCRIPT = Script(FOLDED_ADMIT_LUA)
SETTLE_SCRIPT = Script(SETTLE_LUA)
PLANS_MAX = 10_000
# A completion waits at most this long for the next admission's script to run in (one script call and
# one write per request instead of two). Other processes see a lease released and unused tokens
# refunded up to this much later (never earlier), so the limits only ever err on the strict side.
FINISH_DELAY_S = 0.001
PIPE_NAME = "inferchain-limiter"  # in CLIENT LIST
# Allowances (docs/proxy.md, "Allowances"): a process that admits requests of one key back to back asks,
# inside an admission's script, for units of every limit set aside for it (counted in Redis as used at
# once, so the limits stay exact across processes) and spends them without a round trip for at most
# `allowance_ms` (PROXY_LIMIT_ALLOWANCE_MS). A grant takes at most 1/ALLOWANCE_SHARE of what any limit
# has left, and none at all below 2 x ALLOWANCE_SHARE requests (or one reservation's tokens) left: near
# a limit every admission goes to Redis, exactly as without allowances.
ALLOWANCE_MS = 250
ALLOWANCE_SHARE = 16
ALLOWANCE_MAX_REQUESTS = 256
ALLOWANCE_REFILL_AT = 4  # the next allowance is asked for once a quarter of anything it granted is left
GRANT_ARGS = 6  # ADMIT_LUA's ARGV after the limits: id, requests, tokens, slots, term ms, share


class Limiter:
    """The Redis side of admission. Construct one per event loop (it holds an asyncio Redis client)."""

    def __init__(
        self, client: aioredis.Redis, *, lease_ms: int = LEASE_MS, allowance_ms: int = ALLOWANCE_MS
    ) -> None:
        self.redis = client
        self.lease_ms = lease_ms
        self.allowance_ms = allowance_ms
        self._admit = client.register_script(ADMIT_LUA)
        self._finish = client.register_script(FINISH_LUA)
        self._renew = client.register_script(RENEW_LUA)
        self.pipe: RedisPipe | None = None  # None until first used, and for clients it cannot serve
        self.pipe_checked = False
        self._plans: dict[tuple[int, int, Limits, Limits], _Plan] = {}
        self._day = ""
        self._day_end = 0.0  # epoch seconds of the next 00:00 UTC
        # Completions not yet sent: (plan, id, reserved, actual); they ride in the next admission's
        # script, or leave on their own after FINISH_DELAY_S if no admission comes.
        self._finishes: list[tuple[_Plan, bytes, int, int]] = []
        self._finish_timer: asyncio.TimerHandle | None = None
        # Allowance ids: unique across processes (Redis members), short.
        self._aid_prefix = b"a" + os.urandom(5).hex().encode() + b"."
        self._aid_next = 0
        self._no_grant = (
            bulk(b"") + bulk(b"0") * 3 + bulk(b"%d" % allowance_ms) + bulk(b"%d" % ALLOWANCE_SHARE)
        )
        self.granted = 0  # allowances granted to this process (tests, benchmarks)
        self._term_s = allowance_ms / 1000
        self._loop: asyncio.AbstractEventLoop | None = None
        self._by_info: dict[int, tuple[KeyInfo, _Plan]] = {}
        self._unsettled: set[_Allowance] = set()

    def _lean(self) -> RedisPipe | None:
        if not self.pipe_checked:
            self.pipe_checked = True
            params = lean_params(self.redis)
            if params is not None:
                self.pipe = RedisPipe(**params, scripts=(ADMIT_SCRIPT, FOLDED_ADMIT_SCRIPT), name=PIPE_NAME)
        return self.pipe

    def _today(self) -> tuple[str, int]:
        """The UTC day's key suffix and the milliseconds left in it (the process's clock, as before)."""
        now = time.time()
        if now >= self._day_end:
            today = dt.datetime.fromtimestamp(now, dt.UTC).date()
            self._day = today.strftime("%Y%m%d")
            midnight = dt.datetime.combine(today + dt.timedelta(days=1), dt.time(), dt.UTC)
            self._day_end = midnight.timestamp()
        return self._day, int((self._day_end - now) * 1000)

    def _plan(self, info: KeyInfo, day: str) -> _Plan | None:
        # By the KeyInfo object first: the key cache hands out the same one for every request of a key
        # until the key changes, and hashing its two Limits dataclasses for the plans' own key costs as
        # much as the rest of an admission out of an allowance.
        hit = self._by_info.get(id(info))
        if hit is not None and hit[0] is info and hit[1].day == day:
            return hit[1]
        cache_key = (info.tenant_id, info.id, info.tenant_limits, info.key_limits)
        plan = self._plans.get(cache_key)
        if plan is None or plan.day != day:
            scopes = _scopes(info)
            if not scopes:
                return None
            if len(self._plans) >= PLANS_MAX:
                self._plans.clear()  # bounded: limits change, keys come and go (allowances settle by timer)
            plan = self._plans[cache_key] = _Plan(scopes, day, self.lease_ms)
        if len(self._by_info) >= PLANS_MAX:
            self._by_info.clear()
        self._by_info[id(info)] = (info, plan)  # holding `info` keeps its id from being reused
        return plan

    async def admit(self, info: KeyInfo, request_id: str, reserve: int) -> Admission | None:
        """Admit or raise a 429 ProxyError. None when no counted limit applies (no Redis call at all)."""
        if not info.tenant_limits.counted and not info.key_limits.counted:
            return None
        day, to_midnight = self._today()
        plan = self._plan(info, day)
        if plan is None:
            return None
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        now = loop.time()
        # Counted from here, admissions on their way included (`finish`, or a refusal, takes it back):
        # the slots an allowance asks for are sized by the most this process had at once.
        plan.running += 1
        if plan.running > plan.peak:
            plan.peak = plan.running
        if now - plan.seen_since >= self._term_s:
            fresh = now - plan.seen_since < 2 * self._term_s
            plan.seen_before, plan.peak_before = (plan.seen, plan.peak) if fresh else (0, 0)
            plan.seen, plan.peak, plan.seen_since = 0, plan.running, now
        plan.seen += 1
        plan.avg_reserve += (reserve - plan.avg_reserve) / 8
        allowance = plan.allowance
        if allowance is not None:
            if (
                now < allowance.until
                and allowance.requests
                and allowance.slots
                and allowance.tokens >= reserve
            ):
                # Running low (a quarter left of anything): this request asks Redis for the next
                # allowance while the others go on spending this one (retired when the next is granted),
                # so that concurrent requests do not find it spent and go to Redis one by one meanwhile.
                if (
                    plan.asking is not None
                    or plan.refused is allowance  # asked already, and Redis had none to give
                    or (
                        allowance.requests * ALLOWANCE_REFILL_AT > allowance.granted_requests
                        and allowance.slots * ALLOWANCE_REFILL_AT > allowance.granted_slots
                        and allowance.tokens * ALLOWANCE_REFILL_AT > allowance.granted_tokens
                    )
                ):
                    return self._take(allowance, request_id, reserve)
            else:
                self._retire(allowance)  # spent or over
        try:
            return await self._admit_plan(plan, request_id, reserve, to_midnight, now)
        except BaseException:
            plan.running -= 1
            raise

    async def _admit_plan(
        self, plan: _Plan, request_id: str, reserve: int, to_midnight: int, now: float
    ) -> Admission:
        """Admission through Redis, asking for an allowance when this process's demand is for one."""
        pipe = self._lean()
        if pipe is None or self.allowance_ms <= 0:
            return await self._admit_remote(plan, pipe, request_id, reserve, to_midnight, None)
        if plan.asking is not None and plan.allowance is None and plan.granting:
            # Spent before the next one came: wait for it rather than going to Redis alone (only while
            # Redis grants them: near a limit, where it does not, every admission asks it directly).
            await plan.asking
            allowance = plan.allowance
            now = asyncio.get_running_loop().time()
            if (
                allowance is not None
                and now < allowance.until
                and allowance.requests
                and allowance.slots
                and allowance.tokens >= reserve
            ):
                return self._take(allowance, request_id, reserve)
        ask = None
        demand = max(plan.seen, plan.seen_before)
        if demand >= 2 and plan.asking is None:
            requests = min(ALLOWANCE_MAX_REQUESTS, 2 * demand)
            term = min(self.allowance_ms, to_midnight)  # a day's budget is never spent the next day
            ask = (
                requests,
                requests * max(reserve, math.ceil(plan.avg_reserve)),
                min(requests, 2 * max(plan.peak, plan.peak_before) + 2),
                term,
                now + term / 1000,
            )
            asking = plan.asking = asyncio.get_running_loop().create_future()
        try:
            return await self._admit_remote(plan, pipe, request_id, reserve, to_midnight, ask)
        finally:
            if ask is not None:
                plan.asking = None
                asking.set_result(None)

    def _take(self, allowance: _Allowance, request_id: str, reserve: int) -> Admission:
        """Admit out of the allowance: no Redis call."""
        allowance.requests -= 1
        allowance.tokens -= reserve
        allowance.slots -= 1
        plan = allowance.plan
        headers: list[tuple[bytes, bytes]] = []
        if allowance.req_limit >= 0:
            left = allowance.req_left - allowance.granted_requests + allowance.requests
            headers += (_LIMIT_REQUESTS, allowance.req_limit_b), (_LEFT_REQUESTS, b"%d" % max(left, 0))
        if allowance.tok_limit >= 0:
            left = allowance.tok_left - allowance.granted_tokens + allowance.tokens
            headers += (_LIMIT_TOKENS, allowance.tok_limit_b), (_LEFT_TOKENS, b"%d" % max(left, 0))
        admission = Admission(
            request_id, reserve, plan.keys, plan.limit_args, plan.lease_keys, headers, plan, allowance
        )
        allowance.running[request_id] = admission
        return admission

    async def _admit_remote(
        self,
        plan: _Plan,
        pipe: RedisPipe | None,
        request_id: str,
        reserve: int,
        to_midnight: int,
        ask: tuple[int, int, int, int, float] | None,
    ) -> Admission:
        """Admission by one script call; with `ask`, the script may also grant an allowance."""
        aid = b""
        if ask is not None:
            self._aid_next += 1
            aid = b"%b%d" % (self._aid_prefix, self._aid_next)
            grant = b"".join(
                bulk(v) for v in (aid, b"%d" % ask[0], b"%d" % ask[1], b"%d" % ask[2], b"%d" % ask[3])
            ) + bulk(b"%d" % ALLOWANCE_SHARE)
        else:
            grant = self._no_grant
        try:
            if pipe is not None and self._finishes:
                result = await self._send_folded(pipe, plan, request_id, reserve, to_midnight, grant)
            elif pipe is not None:
                rid, res, mid = request_id.encode(), b"%d" % reserve, b"%d" % to_midnight
                # One formatting operation, not six concatenations: this runs once per request.
                result = await pipe.send(
                    b"%b$%d\r\n%b\r\n$%d\r\n%b\r\n%b$%d\r\n%b\r\n%b%b"
                    % (
                        plan.keys_part,
                        len(rid),
                        rid,
                        len(res),
                        res,
                        plan.admit_mid,
                        len(mid),
                        mid,
                        plan.admit_tail,
                        grant,
                    ),
                    script=ADMIT_SCRIPT,
                    nargs=plan.admit_nargs,
                )
            else:
                args: list[Any] = [request_id, reserve, self.lease_ms, plan.n, to_midnight, *plan.limit_args]
                args += ["", 0, 0, 0, self.allowance_ms, ALLOWANCE_SHARE]
                result = await self._admit(keys=plan.keys, args=args)
        except (aioredis.RedisError, OSError) as exc:
            raise unavailable(
                "Rate limiting is unavailable (Redis unreachable); request refused rather than admitted "
                "without limits. Retry shortly.",
                code="limits_unavailable",
            ) from exc
        ok, _scope, reason, retry_ms, req_limit, req_left, tok_limit, tok_left = result[:8]
        if isinstance(reason, bytes):
            reason = reason.decode()
        headers = _header_list(int(req_limit), int(req_left), int(tok_limit), int(tok_left))
        if not ok:
            message, code = _MESSAGES[reason]
            if int(retry_ms) >= 0:
                seconds = max(1, math.ceil(int(retry_ms) / 1000))
                headers.append((b"retry-after", str(seconds).encode()))
                reset = f"{seconds}s".encode()
                headers.append(
                    (
                        b"x-ratelimit-reset-requests"
                        if reason == "requests"
                        else b"x-ratelimit-reset-tokens",
                        reset,
                    )
                )
            raise rate_limited(message, code=code, headers=headers)
        if ask is not None and int(result[8]) > 0:
            granted = (int(result[8]), int(result[9]), int(result[10]))
            allowance = _Allowance(
                aid, plan, ask[4], granted, (int(req_limit), int(req_left), int(tok_limit), int(tok_left))
            )
            if plan.allowance is not None:
                self._retire(plan.allowance)
            plan.allowance = allowance
            plan.granting = True
            self.granted += 1
            self._unsettled.add(allowance)
            # Settled when its term ends even if nothing else comes (returning what was not used).
            allowance.timer = asyncio.get_running_loop().call_at(allowance.until, self._settle, allowance)
        elif ask is not None:
            plan.refused = plan.allowance
            plan.granting = False
        return Admission(
            request_id=request_id,
            reserved=reserve,
            keys=plan.keys,
            limit_args=plan.limit_args,
            lease_keys=plan.lease_keys,
            headers=headers,
            plan=plan,
        )

    async def finish(self, admission: Admission, actual_tokens: int) -> None:
        """Release the concurrency lease and true up the token reservation to what was used.

        Over the pipe this returns once the command is queued: it leaves in this loop iteration's
        write, and Redis runs it before any later command of this process (its next admission sees
        the refund); other processes see it within one round trip, as before. A request admitted out
        of an allowance that is still open finishes inside the process: its slot and its unused tokens
        go back to the allowance, its use is settled with it.
        """
        plan = admission.plan
        if plan is not None:
            plan.running -= 1
        allowance = admission.allowance
        if allowance is not None:
            admission.allowance = None
            del allowance.running[admission.request_id]
            allowance.spent += actual_tokens
            allowance.tokens += admission.reserved - actual_tokens
            allowance.slots += 1
            if allowance.retired and not allowance.running:
                self._settle(allowance)
            return
        pipe = self._lean()
        if plan is not None and pipe is not None:
            self._finishes.append((plan, admission.request_id.encode(), admission.reserved, actual_tokens))
            if self._finish_timer is None:
                self._finish_timer = asyncio.get_running_loop().call_later(
                    FINISH_DELAY_S, self._post_finishes
                )
            return
        n = len(admission.keys) // KEYS_PER_SCOPE
        args: list[Any] = [admission.request_id, admission.reserved, actual_tokens, n, *admission.limit_args]
        # On failure the lease lapses by itself within LEASE_MS; the reservation stays un-refunded.
        with contextlib.suppress(aioredis.RedisError, OSError):
            await self._finish(keys=admission.keys, args=args)

    def _retire(self, allowance: _Allowance) -> None:
        """Admit nothing more from the allowance; settle it once the requests it admitted have finished
        (in `finish`; by its timer at the latest), so that they finish inside the process too, rather
        than each sending its own completion. What it did not use stays set aside until then: at most
        the rest of its term."""
        allowance.retired = True
        if allowance.plan.allowance is allowance:
            allowance.plan.allowance = None
        if not allowance.running:
            self._settle(allowance)

    def _settle(self, allowance: _Allowance) -> None:
        """End an allowance: one script call without reply (SETTLE_LUA). If it is lost with the
        connection, what was set aside stays counted until it ages out (the strict side): requests and
        tokens within the minute, slots within the lease, unused budget for the day."""
        if allowance.settled:
            return
        allowance.settled = True
        self._unsettled.discard(allowance)
        if allowance.timer is not None:
            allowance.timer.cancel()
            allowance.timer = None
        plan = allowance.plan
        if plan.allowance is allowance:
            plan.allowance = None
        running = list(allowance.running.values())
        allowance.running.clear()
        for admission in running:
            admission.allowance = None  # from now on an ordinary admission (SETTLE_LUA made it one)
        if self.pipe is None:
            return
        args = [
            bulk(allowance.aid),
            plan.settle_tail,
            *(
                bulk(b"%d" % v)
                for v in (
                    allowance.granted_requests,
                    allowance.granted_requests - allowance.requests,
                    allowance.granted_tokens,
                    allowance.spent,
                    allowance.granted_slots,
                    self.lease_ms,
                    len(running),
                )
            ),
        ]
        for admission in running:
            args += [bulk(admission.request_id.encode()), bulk(b"%d" % admission.reserved)]
        nargs = 1 + len(plan.keys) + 1 + 1 + len(plan.limit_args) + 7 + 2 * len(running)
        # By source: no reply comes back, so a NOSCRIPT could not be seen and retried.
        self.pipe.post(SETTLE_SCRIPT.head(nargs, by_digest=False) + plan.settle_head + b"".join(args))

    async def renew(self, leases: list[tuple[str, str]]) -> None:
        """Extend the leases of requests still running in this process."""
        if not leases:
            return
        await self._renew(keys=[k for k, _ in leases], args=[self.lease_ms, *[rid for _, rid in leases]])

    def _post_finishes(self) -> None:
        """Send the queued completions on their own (no admission came to carry them), without reply."""
        if self._finish_timer is not None:
            self._finish_timer.cancel()
            self._finish_timer = None
        finishes, self._finishes = self._finishes, []
        if self.pipe is None:
            return
        for plan, rid, reserved, actual in finishes:
            res, act = b"%d" % reserved, b"%d" % actual
            # By source, not digest: no reply comes back, so a NOSCRIPT could not be seen and retried.
            self.pipe.post(
                b"%b$%d\r\n%b\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n%b"
                % (plan.finish_head, len(rid), rid, len(res), res, len(act), act, plan.finish_tail)
            )

    def _send_folded(
        self, pipe: RedisPipe, plan: _Plan, request_id: str, reserve: int, to_midnight: int, grant: bytes
    ) -> Any:
        """The admission with every queued completion run first, in the same script call."""
        if self._finish_timer is not None:
            self._finish_timer.cancel()
            self._finish_timer = None
        finishes, self._finishes = self._finishes, []
        rid, res, mid = request_id.encode(), b"%d" % reserve, b"%d" % to_midnight
        keys = [plan.keys_only]
        args = [
            bulk(rid),
            bulk(res),
            plan.admit_mid,
            bulk(mid),
            plan.admit_tail,
            grant,
            bulk(b"%d" % len(finishes)),
        ]
        nkeys = len(plan.keys)
        nargs = 5 + len(plan.limit_args) + GRANT_ARGS + 1
        for fplan, frid, reserved, actual in finishes:
            keys.append(fplan.keys_only)
            nkeys += len(fplan.keys)
            args += [bulk(frid), bulk(b"%d" % reserved), bulk(b"%d" % actual), fplan.finish_tail]
            nargs += 4 + len(fplan.limit_args)
        return pipe.send(
            bulk(b"%d" % nkeys) + b"".join(keys) + b"".join(args),
            script=FOLDED_ADMIT_SCRIPT,
            nargs=1 + nkeys + nargs,
        )

    def settle_all(self) -> None:
        """Settle every allowance not settled yet, retired ones included (at shutdown; tests)."""
        for allowance in list(self._unsettled):
            self._settle(allowance)

    async def aclose(self) -> None:
        self.settle_all()
        if self._finishes:
            self._post_finishes()
        if self.pipe is not None:
            await self.pipe.aclose()
