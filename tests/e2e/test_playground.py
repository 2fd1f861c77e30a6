"""In the browser: the Playground sends a chat from the console through the real `/v1/` path (the web
process's proxy) to simulator engines, streams the answer, and shows the route decision the request log
recorded (deployment, version, pool, reason, request id) and the timings; compare mode sends one prompt
to two versions of the alias at once and shows both answers side by side.

An admin makes a short-lived "playground" key for a tenant from the page; a viewer pastes a tenant's key
(kept in the page only). Bad input comes back as the proxy's error under the field it names; Stop cuts a
stream off (logged 499)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from playwright.sync_api import expect

from console.models import ApiKey, Quota, Tenant, User
from console.services import issue_api_key
from models_registry.models import ModelAlias, ModelVersion
from routing.models import RequestLog
from tests.conftest import PASSWORD
from tests.e2e.harness import LiveConsole, login, screenshot
from tests.routing.fleet import FleetMember, ensure_alias, start_member
from tests.routing.rollouts import new_version

pytestmark = pytest.mark.e2e

ALIAS = "llama-3.1-8b"

# Records the answer's text each time it changes, from before Send: a streamed answer is seen growing
# in several steps; one written whole at the end is seen once.
WATCH_ANSWER = """(testid) => {
  window.__answerLengths = window.__answerLengths || {};
  const seen = (window.__answerLengths[testid] = []);
  const observer = new MutationObserver(() => {
    const el = document.querySelector(`[data-testid="${testid}"] [data-testid="answer"]`);
    const text = el ? el.textContent : "";
    if (text && text !== "…" && seen[seen.length - 1] !== text.length) seen.push(text.length);
  });
  observer.observe(document.body, {subtree: true, childList: true, characterData: true});
}"""


@dataclass
class Fleet:
    alias: ModelAlias
    fp16: ModelVersion  # the active version
    awq: ModelVersion  # deployed under the alias, reached only when named
    on_fp16: FleetMember
    on_awq: FleetMember


@pytest.fixture
def fleet(transactional_db: None, redis_clean: None) -> Iterator[Fleet]:
    """Two versions of the alias, each on one simulator engine, registered before the console starts
    (its proxy loads them at start). Real time: an answer takes long enough to be seen streaming."""
    alias = ensure_alias(ALIAS)
    fp16 = alias.active_version
    awq = new_version(alias, "awq")
    # Answers run to max_tokens ("length"): no early end of sequence to race a Stop or a check.
    members = [
        start_member(ALIAS, "--sim-mean-output-tokens", "1000000", version=v, time_scale=1.0)
        for v in (fp16, awq)
    ]
    yield Fleet(alias, fp16, awq, *members)
    for member in members:
        member.sim.stop()


def _log_row(request_id: str, timeout: float = 10.0) -> RequestLog:
    deadline = time.monotonic() + timeout
    while True:
        row = RequestLog.objects.filter(request_id=request_id).first()
        if row is not None or time.monotonic() > deadline:
            assert row is not None, f"{request_id} never reached the request log"
            return row
        time.sleep(0.1)


def _check_run(run: Any, member: FleetMember, version: ModelVersion, max_tokens: int) -> RequestLog:
    """A finished run pane: the answer, the route decision as logged, the timings; returns its log row."""
    expect(run.get_by_test_id("run-status")).to_have_text("Done (length)", timeout=30_000)
    expect(run.get_by_test_id("answer")).not_to_be_empty()
    deployment = run.get_by_test_id("route-deployment").get_by_role("link", name=member.deployment.name)
    expect(deployment).to_have_attribute("href", f"/nodes/deployments/{member.deployment.pk}")
    expect(run.get_by_test_id("route-version").get_by_role("link", name=str(version))).to_have_attribute(
        "href", f"/models/versions/{version.pk}"
    )
    link = run.get_by_test_id("route-request-id")
    request_id = link.inner_text()
    expect(link).to_have_attribute("href", f"/requests?request_id={request_id}")
    expect(run.get_by_test_id("timing-ttft")).to_have_text(re.compile(r"^\d+ ms$|^\d+\.\d\d s$"))
    expect(run.get_by_test_id("timing-total")).to_have_text(re.compile(r"^\d+ ms$|^\d+\.\d\d s$"))
    expect(run.get_by_test_id("timing-rate")).to_have_text(re.compile(r"^\d+\.\d$"))
    expect(run.get_by_test_id("timing-tokens")).to_have_text(re.compile(rf"^\d+ / {max_tokens}$"))
    row = _log_row(request_id)
    assert row.status == 200 and row.stream and row.completion_tokens == max_tokens
    assert row.deployment_id == member.deployment.pk and row.model_version_id == version.pk
    expect(run.get_by_test_id("route-pool")).to_have_text(row.route_pool)
    expect(run.get_by_test_id("timing-proxy")).to_contain_text("TTFT")
    return row


def _lengths(page: Any, testid: str) -> list[int]:
    lengths: list[int] = page.evaluate(f"window.__answerLengths['{testid}']")
    return lengths


def test_an_admin_chats_with_an_alias_through_a_playground_key(
    fleet: Fleet, live_console: LiveConsole, browser_page: Any, admin_user: User
) -> None:
    acme = Tenant.objects.create(name="acme")
    Quota.objects.create(tenant=acme, requests_per_minute=100)
    page = browser_page
    page.set_viewport_size({"width": 1440, "height": 900})
    login(page, admin_user.username, PASSWORD)
    page.get_by_role("link", name="Playground").click()
    expect(page).to_have_url(f"{live_console.url}/playground")

    # Sending without a key says what is missing.
    page.get_by_label("Message").fill("Tell me about routing.")
    page.get_by_role("button", name="Send").click()
    expect(page.get_by_test_id("key-error")).to_contain_text("Paste a tenant's API key")

    page.get_by_label("Or make a playground key for tenant").select_option(label="acme")
    page.get_by_role("button", name="Make playground key").click()
    expect(page.get_by_test_id("playground-key-made")).to_contain_text("acme")
    key = ApiKey.objects.get(tenant=acme, name="playground")
    assert key.expires_at is not None
    expect(page.get_by_test_id("playground-key-made")).to_contain_text(f"{key.prefix}…")

    expect(page.get_by_label("Model", exact=True)).to_have_value(ALIAS)
    page.get_by_label("Max tokens").fill("40")
    page.evaluate(WATCH_ANSWER, "run-a")
    page.get_by_role("button", name="Send").click()
    run = page.get_by_test_id("run-a")
    row = _check_run(run, fleet.on_fp16, fleet.fp16, 40)
    # The answer was shown growing as it streamed, not written once at the end.
    assert len(_lengths(page, "run-a")) >= 3, _lengths(page, "run-a")
    # The request took the tenant's real path: its key, its tenant, its limits (the quota's headers).
    assert row.tenant_name == "acme" and row.key_prefix == key.prefix
    reason = run.get_by_test_id("route-reason")
    expect(reason).to_contain_text("own pool")

    # A follow-up continues the conversation: the earlier turn is shown and sent again with it.
    first_answer = run.get_by_test_id("answer").inner_text()
    page.get_by_label("Message").fill("And then?")
    page.get_by_role("button", name="Send").click()
    turns = run.get_by_test_id("turn")
    expect(turns).to_have_count(2)
    expect(turns.nth(0)).to_have_text("You: Tell me about routing.")
    expect(turns.nth(1)).to_contain_text(first_answer.strip())
    follow_up = _check_run(run, fleet.on_fp16, fleet.fp16, 40)
    assert follow_up.request_id != row.request_id
    assert follow_up.prompt_tokens is not None and row.prompt_tokens is not None
    assert follow_up.prompt_tokens > row.prompt_tokens + 30  # the 40-token answer went back with it
    row = follow_up
    screenshot(page, "playground-single")

    # The request id leads to the request log's details of this very request.
    run.get_by_test_id("route-request-id").click()
    expect(page.get_by_test_id("request-dialog")).to_contain_text(row.request_id)
    expect(page.get_by_test_id("request-key")).to_contain_text("playground")

    # Bad input: the proxy's refusal, under the field it names.
    page.go_back()
    expect(page).to_have_url(f"{live_console.url}/playground")
    page.get_by_label("Or make a playground key for tenant").select_option(label="acme")
    page.get_by_role("button", name="Make playground key").click()
    page.get_by_label("Message").fill("again")
    page.get_by_label("Max tokens").fill("0")
    page.get_by_role("button", name="Send").click()
    field = page.locator(".field", has=page.get_by_label("Max tokens"))
    expect(field.locator(".field-error")).to_have_text("'max_tokens' must be a positive integer.")
    expect(page.get_by_test_id("run-a").get_by_test_id("run-status")).to_have_text("Failed (400)")
    expect(page.get_by_test_id("run-a").get_by_test_id("route-status")).to_have_text("400")

    # Stop: a long answer cut off mid-stream; the proxy logs a client that left (499).
    page.get_by_label("Max tokens").fill("3000")
    page.get_by_role("button", name="Send").click()
    run = page.get_by_test_id("run-a")
    expect(run.get_by_test_id("run-status")).to_have_text("Streaming…")
    expect(run.get_by_test_id("answer")).to_have_text(re.compile(r"\w+ \w+"))
    page.get_by_role("button", name="Stop").click()
    expect(run.get_by_test_id("run-status")).to_have_text("Stopped")
    expect(run.get_by_test_id("route-status")).to_have_text("499")
    stopped = _log_row(run.get_by_test_id("route-request-id").inner_text())
    assert stopped.completion_tokens is not None and 0 < stopped.completion_tokens < 3000


def test_compare_two_versions_side_by_side_with_a_pasted_tenant_key(
    fleet: Fleet, live_console: LiveConsole, browser_page: Any, viewer_user: User
) -> None:
    acme = Tenant.objects.create(name="acme")
    raw_key = issue_api_key(tenant=acme, name="web app").raw_key
    page = browser_page
    page.set_viewport_size({"width": 1440, "height": 900})
    login(page, viewer_user.username, PASSWORD)
    page.goto("/playground")
    # A viewer cannot make keys: only paste one, which stays in the page.
    expect(page.get_by_role("button", name="Make playground key")).to_have_count(0)
    page.get_by_label("Tenant API key").fill(raw_key)

    page.get_by_label("Compare two targets side by side").check()
    page.get_by_label("Version", exact=True).select_option(str(fleet.fp16.pk))
    page.get_by_label("Version (B)").select_option(str(fleet.awq.pk))
    page.get_by_label("Message").fill("Which version are you?")
    page.get_by_label("Max tokens").fill("30")
    page.evaluate(WATCH_ANSWER, "run-a")
    page.evaluate(WATCH_ANSWER, "run-b")
    page.get_by_role("button", name="Send to both").click()

    left, right = page.get_by_test_id("run-a"), page.get_by_test_id("run-b")
    expect(left.get_by_test_id("run-target")).to_have_text(f"{ALIAS} @ {fleet.fp16}")
    expect(right.get_by_test_id("run-target")).to_have_text(f"{ALIAS} @ {fleet.awq}")
    rows = [
        _check_run(left, fleet.on_fp16, fleet.fp16, 30),
        _check_run(right, fleet.on_awq, fleet.awq, 30),
    ]
    for testid in ("run-a", "run-b"):
        assert len(_lengths(page, testid)) >= 3, (testid, _lengths(page, testid))
    expect(right.get_by_test_id("route-reason")).to_contain_text("named by the request")
    assert all(r.tenant_name == "acme" for r in rows)
    # Sent at once: the two requests were in flight together.
    starts = [r.created_at.timestamp() - (r.latency_ms or 0) / 1000 for r in rows]
    ends = [r.created_at.timestamp() for r in rows]
    assert max(starts) < min(ends), (starts, ends)
    # Side by side: one row, two columns.
    box_a, box_b = left.bounding_box(), right.bounding_box()
    assert box_a is not None and box_b is not None
    assert abs(box_a["y"] - box_b["y"]) < 2 and box_b["x"] >= box_a["x"] + box_a["width"]
    screenshot(page, "playground-compare")
    # The raw key is never written to browser storage.
    assert raw_key not in page.evaluate("JSON.stringify(localStorage) + JSON.stringify(sessionStorage)")
