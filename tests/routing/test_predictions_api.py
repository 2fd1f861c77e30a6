"""GET /api/routing/predictions/: the proxies' published predictor reports, merged per engine and
grouped by the pools that route to it."""

from __future__ import annotations

import orjson
import pytest
from rest_framework.test import APIClient

from core.redis_client import get_redis
from core.redis_client import key as rkey
from tests.routing.history_helpers import make_fleet

pytestmark = pytest.mark.django_db


def report(ep: str, samples: int, ttft_mape: float, ttft_pred: float) -> list[dict[str, object]]:
    return [
        {
            "endpoint_id": ep,
            "samples": samples,
            "warm": samples >= 16,
            "inflight": 1,
            "ttft_predicted_s": ttft_pred,
            "ttft_observed_s": 0.2,
            "tpot_predicted_s": 0.02,
            "tpot_observed_s": 0.021,
            "ttft_mape_pct": ttft_mape,
            "tpot_mape_pct": 5.0,
            "peak_tokens_per_s": 100.0 * samples,
        }
    ]


def test_reports_of_two_proxies_merge_per_engine_under_their_pool(
    viewer_client: APIClient, redis_clean: None
) -> None:
    fleet = make_fleet()
    ep = str(fleet.deployment.pk)
    r = get_redis()
    r.set(rkey("predict", "proc-a"), orjson.dumps(report(ep, 30, 10.0, 0.25)), px=10_000)
    r.set(rkey("predict", "proc-b"), orjson.dumps(report(ep, 10, 30.0, 0.5)), px=10_000)
    body = viewer_client.get("/api/routing/predictions/").json()
    [pool] = [p for p in body if p["pool"] == fleet.pool.name]
    assert pool["alias"] == "llama"
    [engine] = pool["engines"]
    assert engine["deployment_id"] == fleet.deployment.pk and engine["samples"] == 40
    # Errors weighted by samples; the last values of the process with the most samples.
    assert engine["ttft_mape_pct"] == 15.0
    assert engine["ttft_predicted_s"] == 0.25 and engine["warm"] is True
    assert engine["peak_tokens_per_s"] == 3000.0


def test_an_engine_no_proxy_has_seen_is_listed_cold(viewer_client: APIClient, redis_clean: None) -> None:
    fleet = make_fleet()
    body = viewer_client.get("/api/routing/predictions/").json()
    [pool] = [p for p in body if p["pool"] == fleet.pool.name]
    assert pool["engines"][0]["samples"] == 0 and pool["engines"][0]["ttft_mape_pct"] is None


def test_anonymous_is_refused() -> None:
    assert APIClient().get("/api/routing/predictions/").status_code in (401, 403)
