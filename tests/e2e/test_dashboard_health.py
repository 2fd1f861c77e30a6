"""The dashboard opens on the fleet's health: request rate, an error rate of 28 % with its 4xx/5xx split in
an alarming red, p50/p99 latency and TTFT, the host that is down named in red and linked to its alert;
legends give each line's last, mean and max; zooming one chart zooms every chart of the dashboard, and
"Reset zoom" brings back the window."""

from __future__ import annotations

import datetime as dt
import re
import time
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from alerts.choices import AlertState, Metric, Severity
from alerts.models import Alert
from console.models import User
from nodes.choices import HostState
from nodes.models import Gpu, Host
from routing.models import RequestLog, RoutePool
from routing.rollups import services
from routing.rollups.services import gauge_values
from tests.conftest import PASSWORD
from tests.e2e.harness import login, screenshot
from tests.routing.history_helpers import put_point

pytestmark = pytest.mark.e2e

RED = "rgb(194, 55, 47)"  # --danger


def seed(now: float) -> tuple[Alert, float]:
    """An hour of a fleet: a quiet pool, then one bucket of 100 requests with 28 % errors; a GPU's
    history; one host down with its alert firing. Returns the alert and the bad bucket's start."""
    RoutePool.objects.create(name="chat", alias="chat")
    up = Host.objects.create(
        name="edge-2", address="127.0.0.1", state=HostState.ONLINE, last_heartbeat=timezone.now()
    )
    Gpu.objects.create(host=up, index=0, uuid="sim-edge-2-0", memory_total_bytes=80 * 1024**3)
    long_ago = timezone.now() - dt.timedelta(minutes=30)
    Host.objects.create(
        name="edge-1", address="127.0.0.2", state=HostState.UNREACHABLE, last_heartbeat=long_ago
    )
    alert = Alert.objects.create(
        metric=Metric.HOST_DOWN,
        fingerprint="host_down:host=edge-1",
        subject="host edge-1",
        labels={"host": "edge-1"},
        severity=Severity.CRITICAL,
        state=AlertState.FIRING,
        summary="Host edge-1 sends no heartbeat",
        started_at=long_ago,
        fired_at=long_ago + dt.timedelta(minutes=1),
    )
    bad = services.bucket_start(now, 10) - 600  # ten minutes ago
    at = dt.datetime.fromtimestamp(bad + 1, dt.UTC)
    RequestLog.objects.bulk_create(
        RequestLog(
            created_at=at,
            alias="chat",
            route_pool="chat",
            status=status,
            stream=True,
            latency_ms=ms,
            ttft_ms=ttft,
        )
        for status, ms, ttft, n in ((200, 100.0, 40.0, 72), (429, 2.0, None, 8), (503, 1000.0, None, 20))
        for _ in range(n)
    )
    services.rollup_tick(bad + services.REQUEST_LAG_SECONDS + 1)
    for k in range(360):  # the GPU's hour of 10 s points, for the history card's charts
        put_point(
            10,
            "gpu",
            "edge-2:0",
            services.bucket_start(now, 10) - 10 * k,
            gauge_values("gpu", utilization_pct=40.0),
            host="edge-2",
        )
    return alert, bad


def x_range(page: Any, test_id: str) -> tuple[float, float]:
    chart = page.get_by_test_id(test_id)
    return float(chart.get_attribute("data-x-min") or "nan"), float(
        chart.get_attribute("data-x-max") or "nan"
    )


def test_dashboard_shows_health_first_and_zooms_every_chart(
    browser_page: Any, admin_user: User, redis_clean: None
) -> None:
    alert, _bad = seed(time.time())
    page = browser_page
    login(page, admin_user.username, PASSWORD)
    page.goto("/")

    # RED first: the health card is the first card of the page.
    expect(page.locator(".card").first).to_have_attribute("data-testid", "health-card")
    expect(page.get_by_test_id("health-requests-value")).to_contain_text("req/s")
    expect(page.get_by_test_id("health-requests-detail")).to_contain_text("100 requests")
    errors = page.get_by_test_id("health-errors")
    expect(errors.get_by_test_id("health-errors-value")).to_have_text("28%")
    expect(errors.get_by_test_id("health-errors-detail")).to_have_text("4xx 8.0% · 5xx 20%")
    expect(errors).to_have_attribute("data-tone", "bad")
    assert errors.get_by_test_id("health-errors-value").evaluate("e => getComputedStyle(e).color") == RED
    expect(page.get_by_test_id("health-alarm")).to_contain_text("28% of requests failed over the last hour")
    expect(page.get_by_test_id("health-latency-value")).to_have_text(re.compile(r"^p50 \d+ ms$"))
    expect(page.get_by_test_id("health-latency-detail")).to_have_text(re.compile(r"^p99 (\d+ ms|1\.\d\d s)$"))
    expect(page.get_by_test_id("health-ttft-value")).to_have_text(re.compile(r"^p50 \d+ ms$"))
    chat = page.get_by_test_id("health-pools").locator("tbody tr", has_text="chat")
    expect(chat.get_by_test_id("pool-error-rate")).to_have_attribute("data-tone", "bad")
    expect(chat).to_contain_text("8.0% / 20%")

    # The host down: named, in red, a link to its alert.
    down = page.get_by_test_id("host-down-edge-1")
    link = down.get_by_role("link", name="edge-1")
    expect(link).to_have_attribute("href", f"/alerts?alert={alert.pk}")
    assert link.evaluate("e => getComputedStyle(e).color") == RED
    expect(down).to_contain_text("alert firing since")

    # Legends: each line's last, mean and max over the range shown.
    legend = page.get_by_test_id("health-chart-errors-legend")
    five = legend.locator("tr[data-series='5xx']")
    expect(five.locator("[data-stat=max]")).to_have_text("20%")
    expect(five.locator("[data-stat=mean]")).to_have_text("20%")
    expect(five.locator("[data-stat=last]")).to_have_text("20%")
    expect(legend.locator("tr[data-series='alert threshold'] [data-stat=max]")).to_have_text("5%")
    expect(page.get_by_test_id("health-chart-requests-legend").locator("[data-stat=max]")).to_have_text(
        "10 req/s"
    )
    expect(page.get_by_test_id("history-gpu-util-legend")).to_contain_text("edge-2 GPU 0")
    expect(page.get_by_test_id("history-gpu-util-note")).to_contain_text("moving average")
    screenshot(page, "dashboard")
    # docs/screenshots/dashboard-health.png: the health card alone.
    page.get_by_test_id("health-card").screenshot(path=str(screenshot(page, "dashboard-health")))

    # One time range: drag across the requests chart, and the latency and GPU charts follow.
    expect(page.get_by_test_id("history-gpu-util")).to_have_attribute("data-x-min", re.compile(r"\d"))
    before = x_range(page, "history-gpu-util")
    assert before[1] - before[0] >= 3600 - 10, before
    over = page.get_by_test_id("health-chart-requests").locator(".u-over")
    box = over.bounding_box()
    assert box is not None
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.3, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.6, y, steps=10)
    page.mouse.up()
    expect(page.get_by_test_id("chart-zoom")).to_have_attribute("data-zoomed", "true")
    zoomed = x_range(page, "health-chart-requests")
    assert 0.2 * 3600 < zoomed[1] - zoomed[0] < 0.4 * 3600, zoomed
    for other in ("health-chart-latency", "health-chart-errors", "history-gpu-util", "history-gpu-mem"):
        assert x_range(page, other) == pytest.approx(zoomed), other
    screenshot(page, "dashboard-zoomed", full_page=False)

    page.get_by_test_id("chart-zoom-reset").click()
    expect(page.get_by_test_id("chart-zoom")).to_have_attribute("data-zoomed", "false")
    after = x_range(page, "health-chart-latency")
    assert after[1] - after[0] >= 3600 - 10, after

    # The host's link opens its alert.
    link.click()
    expect(page).to_have_url(re.compile(rf"/alerts\?alert={alert.pk}$"))
    expect(page.get_by_test_id("alert-focus-summary")).to_have_text("Host edge-1 sends no heartbeat")
