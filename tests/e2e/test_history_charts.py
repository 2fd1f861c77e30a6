"""Charts with history: the dashboard's History card draws the stored rollups on a time axis with units and
a tooltip; picking 15 min, 1 h and 24 h changes the axis span, the points and the resolution. The pool
history splits success rate and latency by request kind; the deployment and tenant pages draw theirs."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest
from playwright.sync_api import expect

from console.models import User
from routing.models import MetricRollup
from routing.rollups import services
from routing.rollups.services import gauge_values, packed_row
from routing.rollups.stats import latency_bucket
from tests.conftest import PASSWORD
from tests.e2e.harness import login, screenshot
from tests.routing.history_helpers import GIB, make_fleet, publish_engine, publish_gpu

pytestmark = pytest.mark.e2e


def at(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, dt.UTC)


def requests(n: int, ok: int, ms: float) -> dict[str, Any]:
    return {
        "requests": n,
        "ok": ok,
        "prompt_tokens": 100 * n,
        "completion_tokens": 20 * n,
        "latency": {str(latency_bucket(ms)): n},
    }


def seed(fleet: Any) -> None:
    """A day of 1 min points and an hour of 10 s points: 30% utilization, 80% over the last 15 minutes."""
    now = time.time()
    gpu, engine, pool, tenant = "hist-a:0", str(fleet.deployment.pk), fleet.pool.name, str(fleet.tenant.pk)
    rows = []
    for resolution, count in ((10, 360), (60, 1440)):
        last = services.bucket_start(now, resolution) - resolution
        for k in range(count):
            ts = last - k * resolution
            util = 80.0 if now - ts < 900 else 30.0
            gauges = gauge_values(
                "gpu",
                utilization_pct=util,
                memory_used_bytes=60.0 * GIB,
                temperature_c=60.0,
                power_watts=150.0 + 3.0 * util,
            )
            # As the rollup keeps them: each a member of its host's row (services.packed_row).
            gpu_row, gpu_member = packed_row("gpu", gpu)
            rows.append(
                MetricRollup(
                    resolution_s=resolution,
                    kind="gpu",
                    subject=gpu_row,
                    bucket=at(ts),
                    values={gpu_member: gauges},
                )
            )
            engine_row, engine_member = packed_row("engine", engine, fleet.host.name)
            rows.append(
                MetricRollup(
                    resolution_s=resolution,
                    kind="engine",
                    subject=engine_row,
                    bucket=at(ts),
                    values={
                        engine_member: gauge_values(
                            "engine", tokens_per_s=3.5 * util, num_requests_waiting=util / 20, ttft_p95_s=0.25
                        )
                    },
                )
            )
            # Short prompts all succeed in ~100 ms; long ones: 1 of 2 fails, ~2 s.
            short, long = requests(4, 4, 100.0), requests(2, 1, 2000.0)
            total = {**requests(6, 5, 100.0), "latency": {**short["latency"], **long["latency"]}}
            rows.append(
                MetricRollup(
                    resolution_s=resolution,
                    kind="pool",
                    subject=pool,
                    bucket=at(ts),
                    values={"all": total, "short": short, "long": long},
                )
            )
            rows.append(
                MetricRollup(
                    resolution_s=resolution,
                    kind="tenant",
                    subject=tenant,
                    bucket=at(ts),
                    values={"all": total},
                )
            )
    MetricRollup.objects.bulk_create(rows)


def span(chart: Any) -> float:
    return float(chart.get_attribute("data-x-max") or "nan") - float(
        chart.get_attribute("data-x-min") or "nan"
    )


def test_history_charts_follow_the_range_picker(
    browser_page: Any, admin_user: User, redis_clean: None
) -> None:
    fleet = make_fleet(gpus=1)
    seed(fleet)
    # The newest point comes the product's way: live records, then a beat tick (one insert).
    publish_gpu(
        "hist-a", 0, utilization_pct=80.0, memory_used_bytes=60 * GIB, temperature_c=61.0, power_watts=400.0
    )
    publish_engine(fleet.deployment.pk, tokens_per_s=310.0, num_requests_running=3, num_requests_waiting=0)
    services.rollup_tick()

    page = browser_page
    login(page, admin_user.username, PASSWORD)
    page.goto("/")
    card = page.get_by_test_id("fleet-history")
    util = page.get_by_test_id("history-gpu-util")
    # The default range, 1 h: 360 points of 10 s on an axis an hour wide.
    expect(util).to_have_attribute("aria-label", "GPU utilization (%), last hour")
    expect(util).to_have_attribute("data-points", "360")
    assert span(util) == 3600

    card.get_by_test_id("range-picker-15m").click()
    expect(util).to_have_attribute("aria-label", "GPU utilization (%), last 15 min")
    expect(util).to_have_attribute("data-points", "90")
    assert span(util) == 900
    util.locator(".u-over").hover()
    expect(page.get_by_test_id("history-gpu-util-tooltip")).to_contain_text("hist-a GPU 0: 80%")

    card.get_by_test_id("range-picker-1h").click()
    expect(card.get_by_test_id("range-picker-1h")).to_have_attribute("aria-pressed", "true")
    expect(util).to_have_attribute("aria-label", "GPU utilization (%), last hour")
    expect(util).to_have_attribute("data-points", "360")
    assert span(util) == 3600
    expect(page.get_by_test_id("history-gpu-util-box")).to_have_attribute("data-resolution", "10")
    # The legend names each line, with its last, mean and max (uPlot draws the axes and their unit label
    # on the canvas).
    expect(page.get_by_test_id("history-gpu-util-legend")).to_contain_text("hist-a GPU 0")
    mem = page.get_by_test_id("history-gpu-mem")
    mem.locator(".u-over").hover()
    expect(page.get_by_test_id("history-gpu-mem-tooltip")).to_contain_text("60 GiB")
    card.scroll_into_view_if_needed()
    util.locator(".u-over").hover()
    card.screenshot(path=str(screenshot(page, "chart-1h")))

    card.get_by_test_id("range-picker-24h").click()
    expect(util).to_have_attribute("data-points", "1440")
    expect(page.get_by_test_id("history-gpu-util-box")).to_have_attribute("data-resolution", "60")
    assert span(util) == 86400

    # A pool: success rate and latency by request kind over the range.
    page.goto("/routing")
    history = page.get_by_test_id("pool-history")
    history.get_by_test_id("range-picker-15m").click()
    expect(page.get_by_test_id("pool-history-requests")).to_have_attribute("data-points", "90")
    expect(page.get_by_test_id("pool-history-kind-short")).to_contain_text("100%")
    long_row = page.get_by_test_id("pool-history-kind-long")
    expect(long_row).to_contain_text("50%")
    page.get_by_test_id("pool-history-success").locator(".u-over").hover()
    expect(page.get_by_test_id("pool-history-success-tooltip")).to_contain_text("long prompts: 50%")
    screenshot(page, "pool-history")

    page.goto(f"/nodes/deployments/{fleet.deployment.pk}")
    expect(page.get_by_test_id("dh-tps")).to_have_attribute("data-points", "360")
    page.get_by_test_id("deployment-history").get_by_test_id("range-picker-24h").click()
    expect(page.get_by_test_id("dh-tps")).to_have_attribute("data-points", "1440")

    page.goto(f"/tenants/{fleet.tenant.pk}")
    expect(page.get_by_test_id("tenant-history-latency")).to_have_attribute("data-points", "360")
    expect(page.get_by_test_id("tenant-history-kind-all")).to_contain_text("83.3%")
