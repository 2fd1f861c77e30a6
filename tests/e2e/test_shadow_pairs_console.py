"""In the browser: shadow pairs are reviewed in the offline runs' side-by-side view. An evaluator opens an
alias's pairs from the Rollouts page's shadow table, sees the primary's answer beside the shadow
candidate's (word diff, first divergence, metrics), moves with j, marks with 3; the mark is stored with
who and when, and audited. A viewer sees the pairs but cannot mark."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from console.models import User
from core.models import AuditEvent
from routing.models import ShadowConfig, ShadowPair
from tests.conftest import PASSWORD
from tests.e2e.harness import LiveConsole, login, screenshot
from tests.routing.rollouts import Canary, canary, shadow_pair

pytestmark = pytest.mark.e2e


def mirrored(c: Canary) -> tuple[ShadowPair, ShadowPair, ShadowPair]:
    """A shadow config and three pairs, newest first as the list shows them: a candidate that failed, one
    that answered differently, one that answered the same."""
    ShadowConfig.objects.create(alias=c.alias, candidate_version=c.v2, percent=10)
    t0 = timezone.now() - dt.timedelta(minutes=5)
    same = shadow_pair(
        c.alias, c.v1, c.v2, "The capital of France is Paris.", "The capital of France is Paris.", at=t0
    )
    differs = shadow_pair(
        c.alias,
        c.v1,
        c.v2,
        "The capital of France is Paris.",
        "The capital of France is Lyon.",
        prompt="What is the capital of France?",
        at=t0 + dt.timedelta(seconds=1),
    )
    failed = shadow_pair(
        c.alias, c.v1, c.v2, "Hello there.", "", error="HTTP 503: overloaded", at=t0 + dt.timedelta(seconds=2)
    )
    return failed, differs, same


def test_review_shadow_pairs_with_the_keyboard(
    live_console: LiveConsole, browser_page: Any, evaluator_user: User, redis_clean: None
) -> None:
    c = canary("llama-shadow")
    failed, differs, _same = mirrored(c)
    page = browser_page
    login(page, evaluator_user.username, PASSWORD)
    page.get_by_role("link", name="Rollouts").click()
    page.get_by_test_id("shadow-table").get_by_role("link", name="Review pairs").click()
    expect(page).to_have_url(f"{live_console.url}/rollouts/shadow/llama-shadow")
    expect(page.get_by_test_id("pairs-card")).to_contain_text("Pairs (3)")

    view = page.get_by_test_id("sample-view")
    expect(view).to_have_attribute("data-sample", str(failed.pk))
    expect(view.get_by_test_id("candidate-error")).to_contain_text("HTTP 503: overloaded")
    expect(view.get_by_test_id("reference-tokens")).to_have_text("Hello there.")
    expect(view.get_by_test_id("word-diff")).to_have_count(0)  # nothing to compare with

    page.keyboard.press("j")
    expect(view).to_have_attribute("data-sample", str(differs.pk))
    expect(view).to_contain_text("Primary")
    expect(view).to_contain_text("Shadow candidate")
    expect(view).to_contain_text("What is the capital of France?")
    diff = view.get_by_test_id("word-diff-text")
    expect(diff.locator("del")).to_have_text("Paris")
    expect(diff.locator("ins")).to_have_text("Lyon")
    # Word 5 is where they part ("Paris." / "Lyon."): marked on both sides, no shading without logprobs.
    for side in ("reference-tokens", "candidate-tokens"):
        expect(view.get_by_test_id(side).get_by_test_id("divergence-mark")).to_have_count(1)
    metrics = view.get_by_test_id("sample-metrics")
    expect(metrics).to_contain_text("First divergence5 (word)")
    expect(metrics).to_contain_text("chrF")
    expect(metrics).not_to_contain_text("Mean KL")
    expect(view.get_by_test_id("sample-latency")).to_have_text("120 ms → 150 ms")

    view.get_by_label("Comment").fill("wrong city")
    page.locator("body").click(position={"x": 5, "y": 5})  # leave the text box: keys there are typing
    page.keyboard.press("3")
    expect(view.get_by_test_id("sample-mark")).to_have_attribute("data-mark", "regression")
    expect(view.get_by_test_id("sample-mark")).to_contain_text(f"by {evaluator_user.username}")
    expect(page.get_by_test_id("pairs-table").locator("tr.row-selected")).to_contain_text("regression")
    screenshot(page, "shadow-pairs-review")

    differs.refresh_from_db()
    assert (differs.mark, differs.comment, differs.marked_by_id) == (
        "regression",
        "wrong city",
        evaluator_user.pk,
    )
    assert differs.marked_at is not None
    event = AuditEvent.objects.get(object_type="routing.shadowpair", object_id=str(differs.pk))
    assert event.actor_name == evaluator_user.username and (event.after or {})["mark"] == "regression"

    # The filter keeps only the pairs marked regression; the mark survives a reload.
    page.get_by_label("Mark").select_option(label="Regression")
    expect(page.get_by_test_id("pairs-card")).to_contain_text("Pairs (1)")
    page.reload()
    expect(page.get_by_test_id("sample-view").get_by_test_id("sample-mark")).to_have_attribute(
        "data-mark", "regression"
    )


def test_a_viewer_sees_pairs_but_cannot_mark(
    live_console: LiveConsole, browser_page: Any, viewer_user: User, redis_clean: None
) -> None:
    c = canary("llama-shadow")
    failed, differs, _same = mirrored(c)
    page = browser_page
    login(page, viewer_user.username, PASSWORD)
    page.goto("/rollouts/shadow/llama-shadow")
    view = page.get_by_test_id("sample-view")
    expect(view).to_have_attribute("data-sample", str(failed.pk))
    page.keyboard.press("j")
    expect(view).to_have_attribute("data-sample", str(differs.pk))
    page.keyboard.press("3")  # no effect for a viewer
    for name in ("Regression 3", "Same 1", "Acceptable 2"):
        expect(page.get_by_role("button", name=name)).to_have_count(0)
    expect(view.get_by_test_id("sample-mark")).to_have_attribute("data-mark", "")
    assert not ShadowPair.objects.exclude(mark="").exists()
    assert not AuditEvent.objects.filter(object_type="routing.shadowpair").exists()
