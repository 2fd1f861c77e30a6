"""Short series the range conditions need (restarts over 15 min, the queue over 5 min, TTFT's day).

Prometheus keeps these as its TSDB; the console keeps only what the rules read, in Redis next to the
live records: one sorted set per (series, subject) holding the window's samples (one per evaluation,
about 60 at the 15 s default), and for the TTFT baseline one hash per deployment of hourly sums and
counts (26 hours). Everything expires on its own when a subject goes away.
"""

from __future__ import annotations

from collections.abc import Mapping

from core.redis_client import get_redis, key

HOUR = 3600


def window_key(series: str, subject: str) -> str:
    return key("alerts", "window", series, subject)


def baseline_key(subject: str) -> str:
    return key("alerts", "baseline", subject)


def record_windows(
    series: str, values: Mapping[str, float], now: float, window: float
) -> dict[str, list[tuple[float, float]]]:
    """Append each subject's value at `now`, drop what is older than `window`, return the window's
    samples oldest first (this one included); one pipeline for every subject."""
    if not values:
        return {}
    pipe = get_redis().pipeline(transaction=False)
    subjects = list(values)
    for subject in subjects:
        k = window_key(series, subject)
        # The member carries the time too, so two equal values at different times stay two samples.
        pipe.zadd(k, {f"{now!r}:{values[subject]!r}": now})
        pipe.zremrangebyscore(k, "-inf", f"({now - window!r}")
        pipe.zrange(k, 0, -1)
        pipe.expire(k, int(window * 2) + 60)
    replies = pipe.execute()
    out: dict[str, list[tuple[float, float]]] = {}
    for n, subject in enumerate(subjects):
        members = replies[n * 4 + 2]
        points = []
        for member in members:
            t, _, v = (member.decode() if isinstance(member, bytes) else member).partition(":")
            points.append((float(t), float(v)))
        out[subject] = sorted(points)
    return out


def record_baselines(
    values: Mapping[str, float], now: float, skip: float, span: float
) -> dict[str, float | None]:
    """Add each subject's value to its current hour's sum and count; return its average over the hours
    that lie wholly in [now - skip - span, now - skip] (None before there is any)."""
    if not values:
        return {}
    hour = int(now // HOUR)
    first = int((now - skip - span) // HOUR) + 1
    last = int((now - skip) // HOUR) - 1
    keep_from = first - 1
    pipe = get_redis().pipeline(transaction=False)
    subjects = list(values)
    for subject in subjects:
        k = baseline_key(subject)
        pipe.hincrbyfloat(k, f"{hour}:s", values[subject])
        pipe.hincrby(k, f"{hour}:n", 1)
        pipe.hgetall(k)
        pipe.expire(k, int(skip + span + 2 * HOUR))
    replies = pipe.execute()
    out: dict[str, float | None] = {}
    stale_pipe = get_redis().pipeline(transaction=False)
    for n, subject in enumerate(subjects):
        fields: dict[bytes | str, bytes | str] = replies[n * 4 + 2]
        total, count = 0.0, 0
        stale = []
        for raw_field, raw_value in fields.items():
            field = raw_field.decode() if isinstance(raw_field, bytes) else raw_field
            h, _, part = field.partition(":")
            if int(h) < keep_from:
                stale.append(field)
            elif first <= int(h) <= last:
                if part == "s":
                    total += float(raw_value)
                else:
                    count += int(raw_value)
        if stale:
            stale_pipe.hdel(baseline_key(subject), *stale)
        out[subject] = total / count if count else None
    if len(stale_pipe):
        stale_pipe.execute()
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
