"""In the browser, a fleet bigger than a page: the Nodes page pages hosts and deployments on the server with
totals, filters them (host state, "down", search; deployment state, model, host) and sorts deployments by
a column; the dashboard summarises (pools, the busiest engines, the hottest GPUs) and names the hosts
that are down, each a link to it."""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from console.models import User
from core.redis_client import get_redis
from models_registry.models import Model, ModelVersion
from nodes.lifecycle import live_deployment_key, live_gpu_key
from nodes.models import Deployment, Gpu, Host
from tests.conftest import PASSWORD
from tests.e2e.harness import LiveConsole, login, screenshot

pytestmark = pytest.mark.e2e

HOSTS, ENGINES = 30, 120
DOWN = (4, 17)


def shown(first: int, last: int, count: int) -> str:
    return f"{first}\u2013{last} of {count}"


@pytest.fixture
def fleet(redis_clean: None) -> list[Deployment]:
    now = timezone.now()
    versions = [
        ModelVersion.objects.create(
            model=Model.objects.create(name=f"page-model-{m}"),
            revision="main",
            source_kind="directory",
            source_path="/m",
        )
        for m in range(2)
    ]
    hosts = Host.objects.bulk_create(
        Host(
            name=f"node-{h:02d}",
            address=f"10.2.0.{h}",
            state="unreachable" if h in DOWN else "online",
            last_heartbeat=now - dt.timedelta(seconds=3600 if h in DOWN else 1),
        )
        for h in range(HOSTS)
    )
    Gpu.objects.bulk_create(
        Gpu(host=host, index=i, uuid=f"GPU-p-{h}-{i}", name="H100", memory_total_bytes=80 * 2**30)
        for h, host in enumerate(hosts)
        for i in range(2)
    )
    deployments = Deployment.objects.bulk_create(
        Deployment(
            name=f"svc-{d:03d}",
            model_version=versions[d % 2],
            host=hosts[d % HOSTS],
            gpu_indices=[0],
            port=9000 + d,
            served_model_name=f"pool-{d % 2}",
            state="ready" if d % 4 else "stopped",
        )
        for d in range(ENGINES)
    )
    r = get_redis()
    r.set(
        live_deployment_key(deployments[5].pk),
        json.dumps({"kv_cache_usage_perc": 0.93, "tokens_per_s": 50.0}),
        ex=300,
    )
    r.set(live_gpu_key("node-09", 1), json.dumps({"utilization_pct": 99.0, "temperature_c": 84.0}), ex=300)
    return deployments


def test_nodes_page_pages_filters_and_sorts_on_the_server(
    live_console: LiveConsole, browser_page: Any, admin_user: User, fleet: list[Deployment]
) -> None:
    page = browser_page
    login(page, admin_user.username, PASSWORD)
    page.goto("/nodes")
    hosts_pager = page.get_by_test_id("hosts-pagination")
    deployments_pager = page.get_by_test_id("deployments-pagination")
    expect(page.get_by_test_id("hosts-total")).to_have_text("30 hosts")
    expect(hosts_pager.get_by_test_id("pagination-range")).to_have_text(shown(1, 12, 30))
    expect(page.get_by_test_id("host-node-00")).to_be_visible()
    expect(page.get_by_test_id("host-node-12")).to_have_count(0)
    hosts_pager.get_by_role("button", name="Next →").click()
    expect(hosts_pager.get_by_test_id("pagination-range")).to_have_text(shown(13, 24, 30))
    expect(page.get_by_test_id("host-node-12")).to_be_visible()

    page.get_by_label("Host state").select_option("down")
    expect(page.get_by_test_id("hosts-total")).to_have_text("2 hosts")
    expect(page.get_by_test_id("host-node-04")).to_be_visible()
    expect(page.get_by_test_id("host-node-17")).to_be_visible()
    page.get_by_label("Host state").select_option("")
    page.get_by_label("Find hosts").fill("node-2")
    expect(page.get_by_test_id("hosts-total")).to_have_text("10 hosts")

    rows = page.get_by_test_id("deployments-table").locator("tbody tr")
    expect(deployments_pager.get_by_test_id("pagination-range")).to_have_text(shown(1, 50, 120))
    expect(rows).to_have_count(50)
    page.get_by_label("State", exact=True).select_option("stopped")
    expect(deployments_pager.get_by_test_id("pagination-range")).to_have_text(shown(1, 30, 30))
    page.get_by_label("Model").fill("page-model-1")
    # Stopped ones are every fourth, all even: none runs model 1.
    expect(page.get_by_test_id("deployments-table")).to_contain_text("No deployments match these filters.")
    page.get_by_label("State", exact=True).select_option("")
    expect(deployments_pager.get_by_test_id("pagination-range")).to_have_text(shown(1, 50, 60))
    # Model 1 still filtered: node-03 holds svc-003, -033, -063 and -093, all odd.
    page.get_by_label("Host", exact=True).fill("node-03")
    expect(deployments_pager.get_by_test_id("pagination-range")).to_have_text(shown(1, 4, 4))
    page.get_by_test_id("sort-port").click()
    expect(rows.first).to_contain_text("svc-003")
    page.get_by_test_id("sort-port").click()
    expect(rows.first).to_contain_text("svc-093")
    # The view is in the URL: shareable, and it survives a reload.
    expect(page).to_have_url(re.compile(r"ordering=-port"))
    page.reload()
    expect(rows.first).to_contain_text("svc-093")
    expect(deployments_pager.get_by_test_id("pagination-range")).to_have_text(shown(1, 4, 4))
    screenshot(page, "nodes_paged_filtered", full_page=False)


def test_dashboard_summarises_a_big_fleet_and_names_the_hosts_down(
    live_console: LiveConsole, browser_page: Any, admin_user: User, fleet: list[Deployment]
) -> None:
    page = browser_page
    login(page, admin_user.username, PASSWORD)
    page.goto("/")
    expect(page.get_by_test_id("stat-hosts")).to_contain_text("28 / 30 online")
    down = page.get_by_test_id("hosts-down")
    expect(down).to_contain_text("node-04")
    expect(down).to_contain_text("node-17")
    expect(page.get_by_test_id("stat-engines")).to_contain_text("90 / 120 ready")
    pools = page.get_by_test_id("pools-table")
    expect(pools.locator("tbody tr")).to_have_count(2)
    expect(pools.locator("tbody tr", has_text="pool-1")).to_contain_text("60 / 60")
    expect(page.get_by_test_id("busiest-engines").locator("tbody tr").first).to_contain_text("svc-005")
    expect(page.get_by_test_id("hottest-gpus").locator("tbody tr").first).to_contain_text("node-09 · GPU 1")
    # One GPU tile per GPU is for small fleets: this one has 60.
    expect(page.get_by_test_id("gpu-card")).to_have_count(0)
    screenshot(page, "dashboard_big_fleet", full_page=False)
    down.get_by_role("link", name="node-17").click()
    expect(page.get_by_test_id("hosts-total")).to_have_text("1 host")
    expect(page.get_by_test_id("host-node-17")).to_be_visible()
