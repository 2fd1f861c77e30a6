"""GET /api/history/: each range picks its resolution and returns the subjects' series on one time grid,
with units; bad ranges and unknown subjects are JSON field errors."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from rest_framework.test import APIClient

from routing.rollups import services
from routing.rollups.services import gauge_values
from routing.rollups.stats import latency_bucket
from tests.routing.history_helpers import make_fleet, put_point

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("range_key", "resolution", "points"),
    [("15m", 10, 90), ("1h", 10, 360), ("24h", 60, 1440), ("7d", 3600, 168), ("90d", 3600, 2160)],
)
def test_each_range_picks_its_resolution(
    viewer_client: APIClient, range_key: str, resolution: int, points: int
) -> None:
    make_fleet()
    now = time.time()
    last = services.bucket_start(now, resolution)
    put_point(resolution, "gpu", "hist-a:0", last - resolution, gauge_values("gpu", utilization_pct=42.0))
    # Outside the range (and at another resolution): not in the answer.
    put_point(
        resolution, "gpu", "hist-a:0", last - points * resolution, gauge_values("gpu", utilization_pct=99.0)
    )
    other = 60 if resolution == 10 else 10
    put_point(
        other,
        "gpu",
        "hist-a:0",
        services.bucket_start(now, other) - other,
        gauge_values("gpu", utilization_pct=7.0),
    )

    # `end` given: a bucket boundary passing between here and the server's clock cannot move the grid.
    end = dt.datetime.fromtimestamp(now, dt.UTC).isoformat()
    body = viewer_client.get(
        "/api/history/", {"range": range_key, "subject": "gpu:hist-a:0", "end": end}
    ).json()
    assert body["resolution_s"] == resolution and body["range"] == range_key
    assert len(body["t"]) == points
    assert body["t"][-1] == last and body["t"][1] - body["t"][0] == resolution
    assert body["end"] - body["start"] == points * resolution
    [gpu] = body["series"]
    assert gpu["subject"] == "gpu:hist-a:0" and gpu["name"] == "hist-a GPU 0"
    util = gpu["values"]["utilization_pct"]
    assert util[-2] == 42.0 and [v for v in util if v is not None] == [42.0]
    assert body["units"]["utilization_pct"] == "%" and body["units"]["memory_used_bytes"] == "bytes"


def test_a_past_range_is_drawn_at_a_resolution_still_kept(viewer_client: APIClient) -> None:
    # An hour that ended two days ago: its 10 s points are past their 24 h retention, so the hour is
    # drawn from its 1 min points (60 of them) rather than as 360 empty 10 s buckets.
    make_fleet()
    end = services.bucket_start(time.time() - 2 * 86400, 60)
    put_point(60, "gpu", "hist-a:0", end - 60, gauge_values("gpu", utilization_pct=33.0))
    body = viewer_client.get(
        "/api/history/",
        {"range": "1h", "subject": "gpu:hist-a:0", "end": dt.datetime.fromtimestamp(end, dt.UTC).isoformat()},
    ).json()
    assert body["resolution_s"] == 60 and len(body["t"]) == 60
    assert body["series"][0]["values"]["utilization_pct"][-2] == 33.0


def test_pool_tenant_and_engine_series(viewer_client: APIClient) -> None:
    fleet = make_fleet()
    now = time.time()
    last = services.bucket_start(now, 10)
    hist = {str(latency_bucket(100.0)): 3, str(latency_bucket(900.0)): 1}
    stats = {"requests": 4, "ok": 3, "prompt_tokens": 400, "completion_tokens": 80, "latency": hist}
    long = {
        "requests": 1,
        "ok": 0,
        "prompt_tokens": 3000,
        "completion_tokens": 0,
        "latency": {str(latency_bucket(900.0)): 1},
    }
    put_point(10, "pool", fleet.pool.name, last - 30, {"all": stats, "short": stats, "long": long})
    put_point(10, "tenant", str(fleet.tenant.pk), last - 30, {"all": stats})
    put_point(
        10,
        "engine",
        str(fleet.deployment.pk),
        last,
        gauge_values("engine", tokens_per_s=250.0, ttft_p95_s=0.3),
        host=fleet.host.name,
    )
    subjects = [f"pool:{fleet.pool.name}", f"tenant:{fleet.tenant.pk}", f"engine:{fleet.deployment.pk}"]
    end = dt.datetime.fromtimestamp(now, dt.UTC).isoformat()
    body = viewer_client.get("/api/history/", {"range": "15m", "subject": subjects, "end": end}).json()
    pool, tenant, engine = body["series"]
    assert pool["values"]["requests_per_s"][-4] == pytest.approx(0.4)
    assert pool["values"]["success_rate"][-4] == 0.75
    assert pool["values"]["long_success_rate"][-4] == 0.0
    assert pool["values"]["long_latency_p95_ms"][-4] == pytest.approx(900.0, rel=0.19)
    # Before the newest request point, a bucket with no row had no requests; after it, nothing is known yet.
    assert pool["values"]["requests_per_s"][-5] == 0.0 and pool["values"]["success_rate"][-5] is None
    assert pool["values"]["requests_per_s"][-1] is None
    assert body["units"]["long_latency_p95_ms"] == "ms" and body["units"]["success_rate"] == "ratio"
    assert tenant["name"] == fleet.tenant.name and tenant["values"]["completion_tokens_per_s"][-4] == 8.0
    assert "short_success_rate" not in tenant["values"]
    # The range as one figure: every request of it (4 in 15 min), their success rate and p95.
    assert pool["summary"]["requests_per_s"] == pytest.approx(4 / 900)
    assert pool["summary"]["success_rate"] == 0.75 and pool["summary"]["long_success_rate"] == 0.0
    assert pool["summary"]["latency_p95_ms"] == pytest.approx(900.0, rel=0.19)
    assert engine["summary"]["tokens_per_s"] == 250.0 and engine["summary"]["itl_p95_s"] is None
    assert engine["name"] == fleet.deployment.name and engine["values"]["tokens_per_s"][-1] == 250.0


def test_bad_range_and_subjects_are_field_errors(viewer_client: APIClient) -> None:
    fleet = make_fleet()
    bad_range = viewer_client.get("/api/history/", {"range": "2h", "subject": "gpu:hist-a:0"})
    assert bad_range.status_code == 400 and "range" in bad_range.json()
    missing = viewer_client.get("/api/history/", {"range": "1h"})
    assert missing.status_code == 400 and "subject" in missing.json()
    subjects = [
        "gpu:hist-a:7",
        "engine:999999",
        "pool:nope",
        f"tenant:{fleet.tenant.pk}",
        "disk:x",
        "gpu:nohost",
    ]
    bad = viewer_client.get("/api/history/", {"subject": subjects})
    assert bad.status_code == 400
    problems = bad.json()["subject"]
    assert len(problems) == 5, problems
    assert any("host hist-a has no GPU 7" in p for p in problems)
    assert any("no deployment with id 999999" in p for p in problems)
    assert any("unknown kind 'disk'" in p for p in problems)
    # An alias without a policy is routed as a pool of its own name: a pool subject too.
    assert viewer_client.get("/api/history/", {"subject": f"pool:{fleet.alias.name}"}).status_code == 200
    unknown_param = viewer_client.get("/api/history/", {"subject": "gpu:hist-a:0", "minutes": "5"})
    assert unknown_param.status_code == 400 and "minutes" in unknown_param.json()
    too_many = viewer_client.get("/api/history/", {"subject": ["gpu:hist-a:0"] * 65})
    assert too_many.status_code == 400 and "subject" in too_many.json()


def test_signed_out_is_refused(anon_client: APIClient) -> None:
    assert anon_client.get("/api/history/", {"subject": "gpu:x:0"}).status_code in (401, 403)
