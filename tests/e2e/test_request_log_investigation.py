"""In the browser: the request log answers "what happened to this request?". A request id typed in the
search (or a link with it) goes straight to the request's details; times read to the millisecond with the
zone named (the browser's, or UTC); the deployment and model version are named and link to their pages;
the route reason reads as steps with rules numbered from 1; the key filter picks a key by name (its id in
the URL, never the key) or from a row's key; a malformed id gets a message under the field."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from console.models import Tenant, User
from console.services import issue_api_key
from models_registry.models import Model, ModelVersion
from nodes.choices import Engine
from nodes.models import Deployment, Host
from routing.models import RequestLog
from tests.conftest import PASSWORD
from tests.e2e.harness import LiveConsole, login, screenshot

pytestmark = pytest.mark.e2e

REQUEST_ID = "5f3c2a9e0b1d4c6e8f7a0000000000aa"
# 05:06:07.891 UTC on a winter day: 06:06:07.891 in Berlin (UTC+01:00).
AT = dt.datetime(2025, 1, 14, 5, 6, 7, 891000, tzinfo=dt.UTC)


def _seed() -> dict[str, Any]:
    acme = Tenant.objects.create(name="acme")
    batch = issue_api_key(tenant=acme, name="batch jobs").api_key
    web = issue_api_key(tenant=acme, name="web app").api_key
    version = ModelVersion.objects.create(
        model=Model.objects.create(name="Llama-3.1-8B-Instruct"),
        revision="awq",
        source_kind="directory",
        source_path="/srv/models/llama-awq",
    )
    host = Host.objects.create(name="gpu-a", address="127.0.0.1")
    deployment = Deployment.objects.create(
        name="llama-awq-0", model_version=version, engine=Engine.SIM, host=host, gpu_indices=[0], port=18002
    )
    common = {
        "tenant_id": acme.pk,
        "tenant_name": "acme",
        "endpoint_kind": "chat",
        "alias": "llama-3.1-8b",
        "status": 200,
        "route_pool": "llama-fast",
        "deployment_id": deployment.pk,
        "model_version_id": version.pk,
        "prompt_tokens": 20,
        "completion_tokens": 5,
    }
    now = timezone.now()
    rows = [
        RequestLog(
            request_id=f"{n:032x}", created_at=now - dt.timedelta(seconds=n), key_prefix=web.prefix, **common
        )
        for n in range(1, 9)
    ]
    rows += [
        RequestLog(
            request_id=f"{100 + n:032x}",
            created_at=now - dt.timedelta(minutes=n),
            key_prefix=batch.prefix,
            **common,
        )
        for n in range(1, 3)
    ]
    rows.append(
        RequestLog(
            request_id=REQUEST_ID,
            created_at=AT,
            key_prefix=batch.prefix,
            upstream="http://127.0.0.1:18002",
            route_reason="policy llama by prompt length rule 1; least_outstanding inflight=0",
            ttft_ms=41.0,
            latency_ms=812.0,
            **common,
        )
    )
    RequestLog.objects.bulk_create(rows)
    return {"batch": batch, "web": web, "deployment": deployment, "version": version}


# The browser in Berlin: times are shown in its zone, and the zone is named.
@pytest.mark.browser_timezone("Europe/Berlin")
def test_find_a_request_by_id_and_filter_by_key(
    live_console: LiveConsole, browser_page: Any, admin_user: User
) -> None:
    seeded = _seed()
    page = browser_page
    login(page, admin_user.username, PASSWORD)
    page.goto("/requests")
    table = page.get_by_test_id("request-log-table")
    expect(table.locator("tbody tr")).to_have_count(11)
    header = table.locator("thead th").first
    expect(header).to_have_text(re.compile(r"When \(UTC\+0[12]:00\)"))
    expect(header.locator("[title]")).to_have_attribute("title", re.compile(r"UTC\+0[12]:00 Europe/Berlin"))
    expect(page.get_by_label("Times in")).to_contain_text("Europe/Berlin")
    expect(table.locator("tbody tr").last.locator("td").first).to_have_text("2025-01-14 06:06:07.891")
    # The deployment by name in the Route column, not "#<id>".
    expect(table.locator("tbody tr").first.locator("td").last).to_have_text("llama-fast → llama-awq-0")

    # Search by request id: straight to the request's details, its id in the URL.
    page.get_by_label("Request id").fill(f"  {REQUEST_ID} ")
    page.get_by_role("button", name="Find").click()
    dialog = page.get_by_test_id("request-dialog")
    expect(dialog).to_be_visible()
    expect(page).to_have_url(f"{live_console.url}/requests?request_id={REQUEST_ID}")
    expect(table.locator("tbody tr")).to_have_count(1)
    expect(dialog.get_by_test_id("request-id")).to_have_text(REQUEST_ID)
    when = dialog.get_by_test_id("request-when")
    expect(when).to_contain_text("2025-01-14 06:06:07.891 UTC+01:00 Europe/Berlin")
    expect(when).to_contain_text("2025-01-14 05:06:07.891 UTC")
    deployment_link = dialog.get_by_test_id("request-deployment").get_by_role("link", name="llama-awq-0")
    expect(deployment_link).to_have_attribute("href", f"/nodes/deployments/{seeded['deployment'].pk}")
    version = dialog.get_by_test_id("request-version")
    version_link = version.get_by_role("link", name="Llama-3.1-8B-Instruct@awq")
    expect(version_link).to_have_attribute("href", f"/models/versions/{seeded['version'].pk}")
    expect(dialog.get_by_test_id("request-key")).to_contain_text(f"batch jobs {seeded['batch'].prefix}…")
    route = dialog.get_by_test_id("request-route")
    expect(route).to_contain_text("Policy “llama by prompt length”: rule 1 matched")
    expect(route).to_contain_text("Engine picked by least outstanding (inflight=0)")
    # The id is copyable.
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    dialog.get_by_test_id("copy-request-id").click()
    expect(dialog.get_by_test_id("copy-request-id")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == REQUEST_ID
    screenshot(page, "request-log-found-by-id", full_page=False)

    # The deployment's link leads to its page.
    deployment_link.click()
    expect(page).to_have_url(f"{live_console.url}/nodes/deployments/{seeded['deployment'].pk}")

    # A link with the request id (e.g. pasted into a ticket) opens the details at once.
    page.goto(f"/requests?request_id={REQUEST_ID}")
    expect(page.get_by_test_id("request-dialog")).to_contain_text(REQUEST_ID)
    dialog.get_by_role("button", name="This key's requests").click()
    expect(dialog).to_be_hidden()
    # The key's requests, by its id in the URL (never the key itself).
    expect(page).to_have_url(f"{live_console.url}/requests?key_id={seeded['batch'].pk}")
    expect(table.locator("tbody tr")).to_have_count(3)
    expect(page.get_by_label("API key")).to_have_value(str(seeded["batch"].pk))

    # The key filter: a key picked by name.
    page.get_by_role("button", name="Clear filters").click()
    expect(table.locator("tbody tr")).to_have_count(11)
    page.get_by_label("API key").select_option(label=f"web app ({seeded['web'].prefix}…) · acme")
    expect(table.locator("tbody tr")).to_have_count(8)
    expect(page).to_have_url(f"{live_console.url}/requests?key_id={seeded['web'].pk}")
    screenshot(page, "request-log-key-filter")

    # Times in UTC on request; the zone is named in the column's header.
    page.get_by_role("button", name="Clear filters").click()
    page.get_by_label("Times in").select_option("utc")
    expect(table.locator("thead th").first).to_have_text("When (UTC)")
    expect(table.locator("tbody tr").last.locator("td").first).to_have_text("2025-01-14 05:06:07.891")

    # A malformed id gets a message under the field, not an empty table that reads "not found".
    page.get_by_label("Request id").fill("not an id")
    page.get_by_role("button", name="Find").click()
    expect(page.get_by_test_id("request-id-search")).to_contain_text("Not a request id")
    # A well-formed id the log does not hold says so.
    page.get_by_label("Request id").fill("0" * 32)
    page.get_by_role("button", name="Find").click()
    expect(table).to_contain_text(f"No request with id {'0' * 32} in the log")
