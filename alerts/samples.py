"""Short series the range conditions need (restarts over 15 min, the queue over 5 min, TTFT's day).

Prometheus keeps these as its TSDB; the console keeps only what the rules read, in Redis next to the
live records: one sorted set per (series, subject) holding the window's samples (one per evaluation,
about 60 at the 15 s default), and for the TTFT baseline one hash per deployment of hourly sums and
counts (26 hours). Everything expires on its own when a subject goes away. Each run writes every
subject's sample in a few Lua calls (CHUNK subjects each) and reads back only what a condition can use.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from core.redis_client import get_redis, key

HOUR = 3600


def window_key(series: str, subject: str) -> str:
    return key("alerts", "window", series, subject)


def baseline_key(subject: str) -> str:
    return key("alerts", "baseline", subject)


# One script call per CHUNK subjects instead of four pipelined commands each: at 5,000 engines the
# pipelines were 60,000 commands a run, most of the evaluation's time spent packing and parsing them in
# redis-py (benchmarks/alert_evaluation.py). Chunks keep Redis free for the proxies between calls.
CHUNK = 1000

# KEYS: one window per subject. ARGV: the score (now), the exclusive cutoff, the TTL, then per subject
# its member and "f" (return the whole window) or "e" (return the members at its oldest and newest
# times only: what an increase needs, and all of them, so ties at one time still sort as before).
WINDOWS_LUA = """
local out = {}
for i, k in ipairs(KEYS) do
  redis.call('ZADD', k, ARGV[1], ARGV[2 + 2 * i])
  redis.call('ZREMRANGEBYSCORE', k, '-inf', ARGV[2])
  redis.call('EXPIRE', k, ARGV[3])
  if ARGV[3 + 2 * i] == 'f' then
    out[i] = redis.call('ZRANGE', k, 0, -1)
  else
    -- The two oldest and the two newest: a tie at either end (rare: a re-run at one time) reads it all.
    local lo = redis.call('ZRANGE', k, 0, 1, 'WITHSCORES')
    local members = {lo[1]}
    if lo[4] == lo[2] then members = redis.call('ZRANGEBYSCORE', k, lo[2], lo[2]) end
    local hi = redis.call('ZRANGE', k, -2, -1, 'WITHSCORES')
    local top = hi[#hi]
    if top ~= lo[2] then
      if hi[2] == top then
        for _, m in ipairs(redis.call('ZRANGEBYSCORE', k, top, top)) do members[#members + 1] = m end
      else
        members[#members + 1] = hi[#hi - 1]
      end
    end
    out[i] = members
  end
end
return out
"""

# KEYS: one hash per subject. ARGV: this hour, the TTL, the first and last hour of the baseline, the
# first hour kept, "1" to drop the fields before it, then per subject its value and "1" to return the
# baseline's fields (the hours in [first, last]). Fields before the kept hour are dropped once an hour
# (when the kept hour moves), not every run: they lie outside every baseline, so only memory is at stake.
BASELINES_LUA = """
local first, last, keep_from = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local prune = ARGV[6] == '1'
local out = {}
for i, k in ipairs(KEYS) do
  redis.call('HINCRBYFLOAT', k, ARGV[1] .. ':s', ARGV[5 + 2 * i])
  redis.call('HINCRBY', k, ARGV[1] .. ':n', 1)
  redis.call('EXPIRE', k, ARGV[2])
  local want = ARGV[6 + 2 * i] == '1'
  local kept = {}
  if prune or want then
    local fields = redis.call('HGETALL', k)
    local stale = {}
    for j = 1, #fields, 2 do
      local h = tonumber(string.match(fields[j], '^(-?%d+):'))
      if h < keep_from then
        stale[#stale + 1] = fields[j]
      elseif want and h >= first and h <= last then
        kept[#kept + 1] = fields[j]
        kept[#kept + 1] = fields[j + 1]
      end
    end
    if prune and #stale > 0 then redis.call('HDEL', k, unpack(stale)) end
  end
  out[i] = kept
end
return out
"""


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def record_windows(
    series: str,
    values: Mapping[str, float],
    now: float,
    window: float,
    full: Collection[str] | None = None,
) -> dict[str, list[tuple[float, float]]]:
    """Append each subject's value at `now`, drop what is older than `window`, return the window's
    samples oldest first (this one included): all of them for the subjects in `full` (every subject
    when None), only the oldest and the newest for the others (what an increase, last - first, needs).
    One script call per CHUNK subjects."""
    if not values:
        return {}
    redis = get_redis()
    script = redis.register_script(WINDOWS_LUA)
    subjects = list(values)
    head = [repr(now), f"({now - window!r}", str(int(window * 2) + 60)]
    out: dict[str, list[tuple[float, float]]] = {}
    for at in range(0, len(subjects), CHUNK):
        chunk = subjects[at : at + CHUNK]
        args: list[str] = list(head)
        for subject in chunk:
            # The member carries the time too, so two equal values at different times stay two samples.
            args.append(f"{now!r}:{values[subject]!r}")
            args.append("f" if full is None or subject in full else "e")
        replies = script(keys=[window_key(series, subject) for subject in chunk], args=args)
        for subject, members in zip(chunk, replies, strict=True):
            points = []
            for member in members:
                t, _, v = _text(member).partition(":")
                points.append((float(t), float(v)))
            out[subject] = sorted(points)
    return out


def _pruned_key() -> str:
    return key("alerts", "baseline", "pruned")


def record_baselines(
    values: Mapping[str, float],
    now: float,
    skip: float,
    span: float,
    wanted: Collection[str] | None = None,
) -> dict[str, float | None]:
    """Add each subject's value to its current hour's sum and count; return its average over the hours
    that lie wholly in [now - skip - span, now - skip] (None before there is any), for the subjects in
    `wanted` (every subject when None; the others map to None). One script call per CHUNK subjects."""
    if not values:
        return {}
    hour = int(now // HOUR)
    first = int((now - skip - span) // HOUR) + 1
    last = int((now - skip) // HOUR) - 1
    keep_from = first - 1
    redis = get_redis()
    script = redis.register_script(BASELINES_LUA)
    # Fields older than the kept hour are dropped in the first run after the kept hour moves.
    previous = redis.set(_pruned_key(), keep_from, get=True, ex=int(skip + span + 2 * HOUR))
    prune = not isinstance(previous, (bytes, str)) or _text(previous) != str(keep_from)
    head = [str(hour), str(int(skip + span + 2 * HOUR)), str(first), str(last), str(keep_from)]
    head.append("1" if prune else "0")
    subjects = list(values)
    out: dict[str, float | None] = {}
    for at in range(0, len(subjects), CHUNK):
        chunk = subjects[at : at + CHUNK]
        args: list[str] = list(head)
        for subject in chunk:
            args.append(repr(float(values[subject])))
            args.append("1" if wanted is None or subject in wanted else "0")
        replies = script(keys=[baseline_key(subject) for subject in chunk], args=args)
        for subject, fields in zip(chunk, replies, strict=True):
            total, count = 0.0, 0
            for n in range(0, len(fields), 2):
                if _text(fields[n]).endswith(":s"):
                    total += float(fields[n + 1])
                else:
                    count += int(fields[n + 1])
            out[subject] = total / count if count else None
    return out


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope per second, as PromQL's deriv(); None with fewer than two samples."""
    if len(points) < 2:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return None
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / var
