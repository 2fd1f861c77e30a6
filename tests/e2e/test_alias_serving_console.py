"""In the browser: every page that shows what serves an alias (Aliases, Rollouts, Models, a version's
page) shows the API's one answer, and that answer is the request log's recent split.

The alias is the demo's shape: fp16 active on one long-context engine, AWQ on two fast engines in a pool
that names it, a policy by prompt length; 64 of the last 100 requests went to AWQ. A page that said
"fp16 100 %, 1 engine ready" (what the console said before) fails here."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from console.models import User
from routing.models import RequestLog
from tests.conftest import PASSWORD
from tests.e2e.harness import LiveConsole, login, screenshot
from tests.routing.rollouts import log_requests
from tests.routing.serving import TwoVersions, log_split, two_version_alias

pytestmark = pytest.mark.e2e

ALIAS = "llama-3.1-8b"


def share(value: float) -> str:
    """A share as the console writes it ("64%", "29.4%")."""
    return f"{round(value, 1):g}%"


def log_shares(tv: TwoVersions) -> dict[int, float]:
    """Each version's percent of the alias's requests sent to an engine in the last 15 minutes."""
    recent = RequestLog.objects.filter(
        alias=tv.alias.name,
        model_version_id__isnull=False,
        created_at__gte=timezone.now() - dt.timedelta(minutes=15),
    )
    total = recent.count()
    return {v.pk: 100 * recent.filter(model_version_id=v.pk).count() / total for v in (tv.fp16, tv.awq)}


def api_answer(page: Any) -> dict[str, Any]:
    reply = page.request.get(f"/api/routing/serving/{ALIAS}/")
    assert reply.ok, reply.text()
    answer: dict[str, Any] = reply.json()
    return answer


def check_split(split: Any, answer: dict[str, Any], expected: dict[int, float]) -> None:
    """One ServingSplit on a page: the API's versions, engines and live shares, equal to the log's."""
    rows = split.get_by_test_id("serving-version")
    expect(rows).to_have_count(len(answer["versions"]))
    for v in answer["versions"]:
        assert v["live_share"] == pytest.approx(expected[v["version_id"]])
        row = split.locator(f"li[data-version='{v['version_id']}']")
        expect(row).to_have_attribute("data-ready", str(v["engines_ready"]))
        expect(row).to_have_attribute("data-total", str(v["engines_total"]))
        expect(row).to_have_attribute("data-requests", str(v["requests"]))
        expect(row.get_by_test_id("serving-live")).to_have_text(f"live {share(expected[v['version_id']])}")
        expect(row.get_by_test_id("serving-engines")).to_have_text(
            f"{v['engines_ready']}/{v['engines_total']} engines ready"
        )
        # Policy rules decide per request: no configured percentage is passed off as a share.
        expect(row).to_contain_text("configured by rule")
    expect(split.get_by_test_id("serving-window")).to_contain_text(
        f"last 15 min, {answer['requests']} requests sent to an engine"
    )


def check_serves(cell: Any, answer: dict[str, Any], version_id: int, expected: dict[int, float]) -> None:
    """A version's "Serves" entry for the alias (Models page, version page)."""
    [v] = [v for v in answer["versions"] if v["version_id"] == version_id]
    entry = cell.locator(f"li[data-alias='{ALIAS}']")
    expect(entry).to_have_attribute("data-ready", str(v["engines_ready"]))
    expect(entry).to_have_attribute("data-total", str(v["engines_total"]))
    expect(entry).to_contain_text(f"live {share(expected[version_id])}")
    expect(entry).to_contain_text(f"{v['engines_ready']}/{v['engines_total']}")


def test_every_page_shows_the_request_logs_split(
    live_console: LiveConsole, browser_page: Any, admin_user: User, redis_clean: None
) -> None:
    tv = two_version_alias(ALIAS)
    log_split(tv)
    expected = log_shares(tv)
    assert round(expected[tv.awq.pk]) == 64
    page = browser_page
    page.set_viewport_size({"width": 1440, "height": 900})
    login(page, admin_user.username, PASSWORD)
    answer = api_answer(page)
    ready = [(v["version_id"], v["engines_ready"]) for v in answer["versions"]]
    assert ready == [(tv.fp16.pk, 1), (tv.awq.pk, 2)]

    page.goto("/models/aliases")
    row = page.get_by_test_id("aliases-table").locator(f"[data-testid=serving][data-alias='{ALIAS}']")
    check_split(row, answer, expected)
    expect(row.locator(f"li[data-version='{tv.fp16.pk}']")).not_to_contain_text("live 100%")
    screenshot(page, "alias-serving-aliases")

    page.goto("/models")
    table = page.get_by_test_id("versions-table")
    for version in (tv.fp16, tv.awq):
        cell = table.locator("tbody tr", has_text=version.revision).first.get_by_test_id("version-serves")
        check_serves(cell, answer, version.pk, expected)
    screenshot(page, "alias-serving-models")

    page.goto(f"/models/versions/{tv.awq.pk}")
    check_serves(page.get_by_test_id("version-serves"), answer, tv.awq.pk, expected)

    page.goto("/rollouts")
    split = page.get_by_test_id("split-table").locator(f"[data-testid=serving][data-alias='{ALIAS}']")
    check_split(split, answer, expected)
    expect(split.locator(f"li[data-version='{tv.awq.pk}']")).to_contain_text(
        f"pool {ALIAS}-fast: rule 2 (prompts up to 6000 tokens)"
    )
    screenshot(page, "alias-serving-rollouts")

    # More traffic to AWQ while the Rollouts page is open: it follows on its own (it re-reads every 2 s),
    # and the API and the request log still agree with it.
    log_requests(tv.alias, tv.awq, 100, at=timezone.now() - dt.timedelta(seconds=30))
    expected = log_shares(tv)
    expect(split.locator(f"li[data-version='{tv.awq.pk}']").get_by_test_id("serving-live")).to_have_text(
        f"live {share(expected[tv.awq.pk])}"
    )
    check_split(split, api_answer(page), expected)
