"""Short series the range conditions need (restarts over 15 min, the queue over 5 min, TTFT's day).

Prometheus keeps these as its TSDB; the console keeps only what the rules read, in Redis next to the
live records. A run's samples of one series are written as **one snapshot** (one JSON object of every
subject's value, one key, indexed by time in one sorted set per series), and the TTFT baseline as one
pair of hashes per hour (sums and counts by subject). Everything expires on its own.

Why snapshots: a sorted set per (series, subject) cost each run a ZADD, a ZREMRANGEBYSCORE, an EXPIRE
and a read per subject, 20,000 Redis calls for two series at 5,000 engines, about 250 ms of a run
(benchmarks/alert_evaluation.py). A snapshot is one SET whatever the fleet's size, and what a condition
reads back is two more: the oldest in the window holds the first sample of every subject that was
there, and the previous one records where each subject that joined since began.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping
from typing import Any

import orjson
from redis import Redis

from core.redis_client import get_redis, key

HOUR = 3600


def snapshot_index_key(series: str) -> str:
    """The sorted set of a series' snapshots: member `<time>:<tag>`, score the run's time."""
    return key("alerts", "snaps", series)


def snapshot_key(series: str, member: str) -> str:
    return key("alerts", "snap", series, member)


def baseline_keys(hour: int) -> tuple[str, str]:
    """The hashes of one hour's TTFT sums and counts, by subject."""
    return key("alerts", "ttft-hour", str(hour), "sums"), key("alerts", "ttft-hour", str(hour), "counts")


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
    when None), only the oldest and the newest for the others (what an increase, last - first, needs;
    every sample at either time, should a re-run at one time have written two).

    Writes one snapshot and, unless a whole window is wanted, reads two: the oldest in the window (every
    subject there since before it) and the previous one, which carries the first sample of each subject
    that joined since (`j`), so a new engine costs no walk through the window. A subject that missed
    a run in between starts its window again at the sample after the gap."""
    if not values:
        return {}
    redis = get_redis()
    ttl = int(window * 2) + 60
    index = snapshot_index_key(series)
    trim = redis.pipeline(transaction=False)
    trim.zremrangebyscore(index, "-inf", f"({now - window!r}")
    trim.zrange(index, 0, -1, withscores=True)
    listed = sorted(((_text(m), float(t)) for m, t in trim.execute()[-1]), key=lambda mt: (mt[1], mt[0]))
    older = [mt for mt in listed if mt[1] < now]
    newer = [mt for mt in listed if mt[1] >= now]  # a re-run at one time: more samples at the newest

    whole = set(values) if full is None else {s for s in full if s in values}
    oldest = [mt for mt in older if mt[1] == older[0][1]] if older else []
    previous = older[-1:] if len(older) > len(oldest) else []
    snaps = _read(redis, series, listed if whole else oldest + previous + newer)
    at_oldest = [snap for t, snap in snaps if oldest and t == oldest[0][1]]
    carried: Mapping[str, list[float]] = {}
    before: Mapping[str, float] = {}
    if previous:
        prev = next((snap for t, snap in snaps if t == previous[0][1]), None)
        if prev is not None:
            carried, before = prev.get("j", {}), prev["v"]
    in_oldest: set[str] = set().union(*(snap["v"].keys() for snap in at_oldest))

    # Each subject's first sample in the window, where it is not in the oldest snapshot.
    joined: dict[str, tuple[float, float]] = {}
    cutoff = oldest[0][1] if oldest else now
    for subject in values.keys() - in_oldest:
        first = carried.get(subject)
        if first is not None and first[0] > cutoff:
            joined[subject] = (first[0], first[1])
        elif subject in before:
            joined[subject] = (previous[0][1], float(before[subject]))
        else:
            joined[subject] = (now, float(values[subject]))
    member = f"{now!r}:{uuid.uuid4().hex[:8]}"  # the tag keeps two runs at one time two snapshots
    body = orjson.dumps({"v": dict(values), "j": {k: [t, v] for k, (t, v) in joined.items()}})
    write = redis.pipeline(transaction=False)
    write.set(snapshot_key(series, member), body, ex=ttl)
    write.zadd(index, {member: now})
    write.expire(index, ttl)
    write.execute()

    mine: Snapshot = (now, {"v": values})
    latest = [mine, *((t, snap) for t, snap in snaps if t >= now)]
    out: dict[str, list[tuple[float, float]]] = {}
    # The usual run: one oldest snapshot and this one, so the two ends without any search.
    alone = at_oldest[0]["v"] if len(at_oldest) == 1 and len(latest) == 1 else None
    for subject in values:
        if alone is not None and subject not in whole:
            head = joined.get(subject) or (cutoff, float(alone[subject]))
            tail = (now, float(values[subject]))
            out[subject] = [head] if head == tail else [head, tail]
            continue
        if subject in whole:
            points = {(t, float(snap["v"][subject])) for t, snap in [*snaps, mine] if subject in snap["v"]}
        else:
            if subject in joined:
                points = {joined[subject]}
            else:
                points = {(cutoff, float(snap["v"][subject])) for snap in at_oldest if subject in snap["v"]}
            top = max(t for t, snap in latest if subject in snap["v"])
            points |= {
                (t, float(snap["v"][subject])) for t, snap in latest if t == top and subject in snap["v"]
            }
        # A set: two runs at one time with one value are one sample, as one (time, value) member was.
        out[subject] = sorted(points)
    return out


Snapshot = tuple[float, Mapping[str, Any]]


def _read(redis: Redis, series: str, listed: list[tuple[str, float]]) -> list[Snapshot]:
    """The listed snapshots' contents, in order; one that expired (its evaluator stopped for long)
    is left out, as a run that wrote no sample."""
    if not listed:
        return []
    raws = redis.mget([snapshot_key(series, m) for m, _ in listed])
    return [(t, orjson.loads(raw)) for (_, t), raw in zip(listed, raws, strict=True) if raw is not None]


# KEYS: the hour's sums and counts. ARGV: the TTL, then per subject its name and value.
# Each chunk's fields are read in one HMGET per hash, added up in Lua and written back in one HSET per
# hash: a HINCRBYFLOAT and a HINCRBY per subject kept Redis busy 5.3 ms per 1,000 subjects, this 1.9 ms
# (benchmarks/alert_evaluation.py). A sum is added in double precision and Redis writes the number back
# exactly (shortest round-trip form); a count stays a whole number, as HINCRBY wrote it.
BASELINES_LUA = """
local n = (#ARGV - 1) / 2
if n < 1 then return 0 end
local names = {}
for i = 1, n do names[i] = ARGV[2 * i] end
local sums = redis.call('HMGET', KEYS[1], unpack(names))
local counts = redis.call('HMGET', KEYS[2], unpack(names))
local s, c = {}, {}
for i = 1, n do
  s[2 * i - 1], s[2 * i] = names[i], (tonumber(sums[i]) or 0) + tonumber(ARGV[2 * i + 1])
  c[2 * i - 1], c[2 * i] = names[i], (tonumber(counts[i]) or 0) + 1
end
redis.call('HSET', KEYS[1], unpack(s))
redis.call('HSET', KEYS[2], unpack(c))
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[1])
return 0
"""

# Subjects per script call: each call holds Redis for its length, so chunks keep it free for the
# proxies between calls.
CHUNK = 1000


def record_baselines(
    values: Mapping[str, float],
    now: float,
    skip: float,
    span: float,
    wanted: Collection[str] | None = None,
) -> dict[str, float | None]:
    """Add each subject's value to its current hour's sum and count; return its average over the hours
    that lie wholly in [now - skip - span, now - skip] (None before there is any), for the subjects in
    `wanted` (every subject when None; the others map to None).

    The hour's sums and counts are two hashes (one script call per CHUNK subjects, and an hour expires
    whole once no baseline can reach it); the averages read only the wanted subjects' fields of the
    baseline's hours, one HMGET per hour and hash."""
    if not values:
        return {}
    hour = int(now // HOUR)
    first = int((now - skip - span) // HOUR) + 1
    last = int((now - skip) // HOUR) - 1
    ttl = int(skip + span + 2 * HOUR)
    redis = get_redis()
    script = redis.register_script(BASELINES_LUA)
    _adopt_per_subject_baselines(redis, ttl)
    sums_key, counts_key = baseline_keys(hour)
    subjects = list(values)
    # Name, value, name, value...: filled by slices and C-level maps, 1.2 ms at 5,000 subjects where a
    # loop appending pairs took 3.
    flat: list[str] = [""] * (2 * len(subjects))
    flat[::2] = subjects
    flat[1::2] = map(repr, map(float, values.values()))
    for at in range(0, len(flat), 2 * CHUNK):
        script(keys=[sums_key, counts_key], args=[str(ttl), *flat[at : at + 2 * CHUNK]])
    out: dict[str, float | None] = dict.fromkeys(values)
    asked = subjects if wanted is None else [s for s in subjects if s in wanted]
    if not asked or last < first:
        return out
    pipe = redis.pipeline(transaction=False)
    for h in range(first, last + 1):
        sums, counts = baseline_keys(h)
        pipe.hmget(sums, asked)
        pipe.hmget(counts, asked)
    replies = pipe.execute()
    for n, subject in enumerate(asked):
        total, count = 0.0, 0
        for h in range(0, len(replies), 2):
            s, c = replies[h][n], replies[h + 1][n]
            if c is not None:
                total += float(s)
                count += int(c)
        out[subject] = total / count if count else None
    return out


def _adopt_per_subject_baselines(redis: Redis, ttl: int) -> None:
    """Moves the baselines an earlier version kept, one hash per subject (`alerts:baseline:<subject>`,
    fields `<hour>:s` and `<hour>:n`), into the hourly hashes, once: an upgrade keeps its engines' day of
    TTFT instead of alerting on no baseline for the next two hours. A marker key says it was done."""
    if not redis.set(key("alerts", "baselines-adopted"), "1", nx=True):
        return
    old = list(redis.scan_iter(match=key("alerts", "baseline", "*"), count=1000))
    redis.delete(key("alerts", "baseline", "pruned"))  # that version's marker, a string
    old = [name for name in old if not _text(name).endswith(":pruned")]
    for at in range(0, len(old), CHUNK):
        chunk = old[at : at + CHUNK]
        read = redis.pipeline(transaction=False)
        for name in chunk:
            read.hgetall(name)
        write = redis.pipeline(transaction=False)
        for name, fields in zip(chunk, read.execute(), strict=True):
            subject = _text(name).rsplit(":", 1)[-1]
            for field, value in fields.items():
                hour, _, part = _text(field).partition(":")
                sums, counts = baseline_keys(int(hour))
                if part == "s":
                    write.hincrbyfloat(sums, subject, float(value))
                    write.expire(sums, ttl)
                elif part == "n":
                    write.hincrby(counts, subject, int(value))
                    write.expire(counts, ttl)
            write.delete(name)
        write.execute()


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
