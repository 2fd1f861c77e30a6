"""Coarser history points are computed from finer ones exactly: gauge means weighted by their samples,
request counts and latency histograms summed (so percentiles are those of all the requests). Checked
by hand on a small case, 10 s -> 1 min -> 1 h."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from nodes.models import Host
from routing.models import HistoryProgress, MetricRollup
from routing.rollups import services
from routing.rollups.services import GPU_FIELDS, gauge_values, named_gauges
from routing.rollups.stats import (
    encode_gauges,
    gauge_list,
    latency_bucket,
    percentile,
    request_series_point,
    significant,
)
from tests.routing.history_helpers import put_point

pytestmark = pytest.mark.django_db


def at(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, dt.UTC)


def put(resolution: int, kind: str, subject: str, ts: float, values: Any) -> None:
    put_point(resolution, kind, subject, ts, values)


def requests(n: int, ok: int, latencies: list[float]) -> dict[str, Any]:
    hist: dict[str, int] = {}
    for ms in latencies:
        hist[str(latency_bucket(ms))] = hist.get(str(latency_bucket(ms)), 0) + 1
    return {"requests": n, "ok": ok, "prompt_tokens": 10 * n, "completion_tokens": 2 * n, "latency": hist}


def test_ten_seconds_to_one_minute_to_one_hour() -> None:
    hour = services.bucket_start(time.time(), 3600) - 2 * 3600
    # Minute 1: six 10 s points of one GPU, utilization 10..60 (mean 35); the last has no temperature.
    for k, util in enumerate([10.0, 20.0, 30.0, 40.0, 50.0, 60.0]):
        # Temperatures 60..64: mean 62 over the five that have one.
        point = gauge_values("gpu", utilization_pct=util, temperature_c=60.0 + k)
        if k == 5:
            point[GPU_FIELDS.index("temperature_c") + 1] = None
        put(10, "gpu", "h:0", hour + 10 * k, point)
    # Minute 2: three points at 80%.
    for k in range(3):
        put(10, "gpu", "h:0", hour + 60 + 10 * k, gauge_values("gpu", utilization_pct=80.0))
    # A pool: two 10 s points in minute 1 (4 requests, 3 ok; 100, 100, 400, 900 ms), one in minute 2.
    put(
        10,
        "pool",
        "fast",
        hour,
        {"all": requests(2, 2, [100.0, 100.0]), "short": requests(2, 2, [100.0, 100.0])},
    )
    put(
        10,
        "pool",
        "fast",
        hour + 30,
        {"all": requests(2, 1, [400.0, 900.0]), "long": requests(2, 1, [400.0, 900.0])},
    )
    put(10, "pool", "fast", hour + 70, {"all": requests(1, 0, [5000.0])})
    # A point of the next hour stays out of this hour's aggregate.
    put(10, "gpu", "h:0", hour + 3600, gauge_values("gpu", utilization_pct=0.0))

    with CaptureQueriesContext(connection) as ctx:
        runs = [services.aggregate(60, now=hour + 160) for _ in range(5)]
    # A slice a run, oldest minute first: its hosts' gauges in one INSERT ... SELECT inside the
    # database, whatever the number of GPUs and engines; then its pools' request points in one COPY.
    assert [(r.slices, r.buckets, r.rows) for r in runs] == [
        (1, 0, 1),
        (1, 1, 1),
        (1, 0, 1),
        (1, 1, 1),
        (0, 0, 0),
    ]
    inserts = [q["sql"] for q in ctx.captured_queries if "INSERT INTO routing_metricrollup" in q["sql"]]
    assert len(inserts) == 2 and all("SELECT" in sql.split("INSERT INTO", 1)[1] for sql in inserts)
    assert sum(q["sql"].startswith("COPY") for q in ctx.captured_queries) == 2

    m1 = named_gauges(
        "gpu", MetricRollup.objects.get(resolution_s=60, kind="gpu", subject="h", bucket=at(hour)).values["0"]
    )
    assert m1 == {"n": 6, "utilization_pct": pytest.approx(35.0), "temperature_c": pytest.approx(62.0)}
    m2 = named_gauges(
        "gpu",
        MetricRollup.objects.get(resolution_s=60, kind="gpu", subject="h", bucket=at(hour + 60)).values["0"],
    )
    assert m2 == {"n": 3, "utilization_pct": pytest.approx(80.0)}
    pool = MetricRollup.objects.get(resolution_s=60, kind="pool", subject="fast", bucket=at(hour)).values
    assert pool["all"]["requests"] == 4 and pool["all"]["ok"] == 3 and pool["all"]["prompt_tokens"] == 40
    assert pool["short"]["requests"] == 2 and pool["long"]["requests"] == 2 and pool["long"]["ok"] == 1
    figures = request_series_point(pool["all"], 60)
    assert figures["success_rate"] == 0.75
    assert figures["requests_per_s"] == pytest.approx(4 / 60)
    # By hand: 100 ms is in bucket 27 ((2^6.5, 2^6.75] ms); the median (rank 2 of 4) is its top, 2^6.75.
    assert figures["latency_p50_ms"] == pytest.approx(2**6.75)  # 107.6 ms, true median 100-400 ms
    # p95 is rank 3.8: in 900 ms's bucket 40 ((2^9.75, 2^10]), 0.8 of the way up.
    assert figures["latency_p95_ms"] == pytest.approx(2**9.75 + 0.8 * (2**10 - 2**9.75))  # 991.4 ms
    assert figures["latency_p95_ms"] == pytest.approx(900.0, rel=0.19)

    # Run again: nothing left to aggregate, nothing written.
    assert services.aggregate(60, now=hour + 160).rows == 0

    # The hosts' slice, then the pools' and tenants' (aggregate_slice): done in the second run.
    assert [services.aggregate(3600, now=hour + 3700).buckets for _ in range(3)] == [0, 1, 0]
    h = named_gauges(
        "gpu",
        MetricRollup.objects.get(resolution_s=3600, kind="gpu", subject="h", bucket=at(hour)).values["0"],
    )
    # (6 x 35 + 3 x 80) / 9 = 50; the temperature's mean stays over its five samples.
    assert h == {"n": 9, "utilization_pct": pytest.approx(50.0), "temperature_c": pytest.approx(62.0)}
    hp = MetricRollup.objects.get(resolution_s=3600, kind="pool", subject="fast", bucket=at(hour)).values
    assert hp["all"]["requests"] == 5 and hp["all"]["ok"] == 3
    # The hour's p95 is that of all 5 requests (rank 4.75: the 5 s one), not a mean of minute p95s.
    assert percentile(hp["all"]["latency"], 0.95) == pytest.approx(5000.0, rel=0.19)
    assert not MetricRollup.objects.filter(resolution_s=60, bucket=at(hour + 3600)).exists()


def test_a_bucket_is_aggregated_only_once_settled() -> None:
    minute = services.bucket_start(time.time(), 60) - 600
    put(10, "gpu", "h:0", minute, gauge_values("gpu", utilization_pct=5.0))
    # 20 s after the minute ended, its last request points may not be written yet: not aggregated.
    assert services.aggregate(60, now=minute + 80).rows == 0
    assert services.aggregate(60, now=minute + 90).rows == 1


def test_coarser_means_keep_four_significant_digits() -> None:
    # A mean of samples has as many digits as a float holds (10.333333333333334); a coarser point keeps
    # four significant ones, in PostgreSQL's aggregation and in stats.significant (the SQLite path).
    minute = services.bucket_start(time.time(), 60) - 600
    for k, (util, used) in enumerate([(10.0, 49104649512.0), (10.0, 49104649512.0), (11.0, 49104649513.0)]):
        put(
            10,
            "gpu",
            "h:0",
            minute + 10 * k,
            gauge_values("gpu", utilization_pct=util, memory_used_bytes=used),
        )
    assert services.aggregate(60, now=minute + 90).rows == 1
    point = MetricRollup.objects.get(resolution_s=60, kind="gpu", subject="h", bucket=at(minute)).values["0"]
    assert named_gauges("gpu", point) == {"n": 3, "utilization_pct": 10.33, "memory_used_bytes": 49100000000}
    # Kept as short text ("n,mean,...", empty where null), half the bytes of a JSON list in jsonb.
    assert isinstance(point, str) and point.startswith("3,10.33,49100000000,,")
    assert encode_gauges([3, 10.333333333333334, 49104649512.0, None]) == "3,10.33,4.91e+10,"
    assert gauge_list("3,10.33,4.91e+10,") == [3.0, 10.33, 49100000000.0, None]
    assert significant([3, 10.333333333333334, 49104649512.33, 0.0, None, 0.012345]) == [
        3,
        10.33,
        49100000000.0,
        0.0,
        None,
        0.01235,
    ]


def _hour_rows(hour: float, kinds: tuple[str, ...] = ("gpu", "engine")) -> dict[str, Any]:
    return dict(
        MetricRollup.objects.filter(resolution_s=3600, bucket=at(hour), kind__in=kinds).values_list(
            "subject", "values"
        )
    )


def test_an_hour_is_written_a_slice_a_run(settings: Any) -> None:
    """HISTORY_HOUR_HOSTS_PER_RUN hosts a run, by name, the last host slice open-ended (a host gone from
    the inventory is written too); then HISTORY_HOUR_REQUEST_SUBJECTS_PER_RUN pools and tenants a run.
    Until the last one, the hour's request series read as not yet written; then nothing more is done."""
    settings.HISTORY_HOUR_HOSTS_PER_RUN = 2
    settings.HISTORY_HOUR_REQUEST_SUBJECTS_PER_RUN = 2
    hour = services.bucket_start(time.time(), 3600) - 2 * 3600
    names = ["h1", "h2", "h3", "h4", "h5"]
    for name in names:
        Host.objects.create(name=name)
    for k, name in enumerate([*names, "zz-gone"]):  # zz-gone: a host deleted since the hour
        for minute in (0, 30):
            put(60, "gpu", f"{name}:0", hour + 60 * minute, encode_gauges([3, 10.0 * (k + 1) + minute]))
    for pool in ("p1", "p2", "p3"):
        put(60, "pool", pool, hour, {"all": requests(2, 2, [100.0, 100.0])})
        put(60, "pool", pool, hour + 600, {"all": requests(1, 0, [900.0])})
    put(60, "tenant", "7", hour, {"all": requests(3, 3, [100.0, 100.0, 100.0])})
    put(3600, "pool", "p1", hour - 3600, {"all": requests(1, 1, [100.0])})  # the hour before, written
    now = hour + 3600 + services.SETTLE_SECONDS + 1

    hosts_written: list[set[str]] = []
    requests_written: list[set[str]] = []
    newest: list[float | None] = []
    for _ in range(5):
        result = services.aggregate(3600, now)
        hosts_written.append(set(_hour_rows(hour)))
        requests_written.append(set(_hour_rows(hour, ("pool", "tenant"))))
        newest.append(services.newest_request_bucket(3600))
        assert (result.buckets == 1) == (len(hosts_written) == 5)
    assert hosts_written == [{"h1", "h2"}, {"h1", "h2", "h3", "h4"}] + [{*names, "zz-gone"}] * 3
    # (kind, subject) order: pool p1, p2; then p3 and tenant 7.
    assert requests_written == [set(), set(), set(), {"p1", "p2"}, {"p1", "p2", "p3", "7"}]
    # Half-written, the hour is not the newest with request points: the hour before is.
    assert newest == [hour - 3600] * 4 + [hour]
    # Each host's hour is the mean of its two minutes (3 samples each): 10 (k + 1) + 15.
    for k, name in enumerate([*names, "zz-gone"]):
        point = named_gauges("gpu", _hour_rows(hour)[name]["0"])
        assert point == {"n": 6, "utilization_pct": pytest.approx(10.0 * (k + 1) + 15)}
    pools = _hour_rows(hour, ("pool", "tenant"))
    assert [pools[p]["all"]["requests"] for p in ("p1", "p2", "p3", "7")] == [3, 3, 3, 3]
    assert pools["p1"]["all"]["ok"] == 2
    assert HistoryProgress.objects.get(resolution_s=3600, bucket=at(hour)).done

    # Done: the next runs read the progress row and write nothing.
    with CaptureQueriesContext(connection) as ctx:
        assert services.aggregate(3600, now + 60) == services.Aggregated(3600, 0, 0)
    assert not [q for q in ctx.captured_queries if "INSERT" in q["sql"] or "COPY" in q["sql"]]


def test_a_failed_slice_leaves_the_progress_where_it_was(settings: Any, monkeypatch: Any) -> None:
    settings.HISTORY_HOUR_REQUEST_SUBJECTS_PER_RUN = 1
    hour = services.bucket_start(time.time(), 3600) - 2 * 3600
    Host.objects.create(name="h1")
    put(60, "gpu", "h1:0", hour, encode_gauges([1, 50.0]))
    for pool in ("p1", "p2"):
        put(60, "pool", pool, hour, {"all": requests(1, 1, [100.0])})
    now = hour + 3600 + services.SETTLE_SECONDS + 1
    services.aggregate(3600, now)  # the hosts
    services.aggregate(3600, now)  # p1
    assert set(_hour_rows(hour, ("pool",))) == {"p1"}

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the database went away mid-slice")

    monkeypatch.setattr(services, "_insert", broken)
    with pytest.raises(RuntimeError):
        services.aggregate(3600, now)
    # Nothing of p2 and the progress row where it was: the next run writes p2, the last.
    assert HistoryProgress.objects.get(bucket=at(hour)).after == "pool:p1"
    monkeypatch.undo()
    assert [services.aggregate(3600, now).buckets for _ in range(2)] == [1, 0]
    assert set(_hour_rows(hour, ("pool",))) == {"p1", "p2"}


def test_an_hour_written_whole_before_the_slices_is_not_written_again() -> None:
    """An upgraded control plane: the hours the version before wrote have 1 h points and no progress."""
    hour = services.bucket_start(time.time(), 3600) - 2 * 3600
    Host.objects.create(name="h1")
    put(60, "gpu", "h1:0", hour, encode_gauges([1, 50.0]))
    put(3600, "gpu", "h1:0", hour, encode_gauges([1, 50.0]))
    put(60, "gpu", "h2:0", hour, encode_gauges([1, 70.0]))
    assert services.aggregate(3600, hour + 3600 + services.SETTLE_SECONDS + 1).rows == 0
    assert set(_hour_rows(hour)) == {"h1"}
    assert HistoryProgress.objects.get(bucket=at(hour)).done


def test_a_minute_is_written_in_at_most_eight_host_slices_then_its_pools_at_once(settings: Any) -> None:
    """Beat runs a slice every 5 s: a minute's slices must fit in its minute whatever the fleet, so a
    slice takes more hosts than HISTORY_MINUTE_HOSTS_PER_RUN when there would be more than 8."""
    settings.HISTORY_MINUTE_HOSTS_PER_RUN = 1
    assert services.HOST_SLICES_AT_MOST[60] == 8
    minute = services.bucket_start(time.time(), 60) - 600
    names = [f"h{k:02d}" for k in range(16)]
    for k, name in enumerate(names):
        Host.objects.create(name=name)
        put(10, "gpu", f"{name}:0", minute, gauge_values("gpu", utilization_pct=float(k)))
    for pool in ("p1", "p2", "p3"):
        put(10, "pool", pool, minute, {"all": requests(1, 1, [100.0])})
    written = []
    for _ in range(10):
        result = services.aggregate(60, now=minute + 90)
        rows = MetricRollup.objects.filter(resolution_s=60, bucket=at(minute))
        written.append((result.slices, rows.filter(kind="gpu").count()))
        # The pools' minute comes whole in the last slice: before it, none of them.
        assert rows.filter(kind="pool").count() in (0, 3)
    # Two hosts a slice (16 / 8), then the pools, then nothing left.
    assert written == [(1, 2 * k) for k in range(1, 9)] + [(1, 16), (0, 16)]
    assert MetricRollup.objects.filter(resolution_s=60, bucket=at(minute), kind="pool").count() == 3
    assert named_gauges("gpu", _rows(60, minute)["h04"]["0"])["utilization_pct"] == 4.0


def _rows(resolution: int, bucket: float) -> dict[str, Any]:
    return dict(
        MetricRollup.objects.filter(resolution_s=resolution, bucket=at(bucket), kind="gpu").values_list(
            "subject", "values"
        )
    )
