"""The Routing page's "Predicted vs observed latency" card: each pool's engines with the proxies'
published predictions, the last observed values and the predictors' error; a cold engine says so."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from playwright.sync_api import expect

from console.models import User
from core.redis_client import get_redis
from core.redis_client import key as rkey
from tests.conftest import PASSWORD
from tests.e2e.harness import login, screenshot
from tests.routing.history_helpers import make_fleet

pytestmark = pytest.mark.e2e


def test_pool_engines_show_predicted_vs_observed(
    browser_page: Any, admin_user: User, redis_clean: None
) -> None:
    fleet = make_fleet()
    report = [
        {
            "endpoint_id": str(fleet.deployment.pk),
            "samples": 42,
            "warm": True,
            "inflight": 0,
            "ttft_predicted_s": 0.25,
            "ttft_observed_s": 0.3,
            "tpot_predicted_s": 0.02,
            "tpot_observed_s": 0.021,
            "ttft_mape_pct": 12.5,
            "tpot_mape_pct": 4.2,
            "peak_tokens_per_s": 1234.0,
        }
    ]
    get_redis().set(rkey("predict", "e2e-proc"), orjson.dumps(report), px=60_000)
    page = browser_page
    login(page, admin_user.username, PASSWORD)
    page.goto("/routing")
    pool = page.get_by_test_id(f"predictions-pool-{fleet.pool.name}")
    expect(pool).to_contain_text(fleet.deployment.name)
    expect(pool).to_contain_text("250 ms / 300 ms")
    expect(pool).to_contain_text("12.5%")
    expect(pool).to_contain_text("42")
    expect(pool).not_to_contain_text("(cold)")
    screenshot(page, "routing-predictions")
