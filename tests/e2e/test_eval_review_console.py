"""In the browser, an evaluator reviews a finished evaluation run with the keyboard and signs it off: the
mark persists, the verdict shows on the run page and on the candidate version's page, and the audit log
has it. The run is made through the ORM (tests/evals/review_helpers.py), so no engine is needed."""

from __future__ import annotations

import csv
import io
import threading
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from console.models import User
from core.live import push_live_event
from core.models import AuditEvent
from models_registry.evaluation.models import EvalReview, EvalRun, EvalVerdict, RunState
from models_registry.evaluation.runner import run_group
from tests.conftest import PASSWORD
from tests.e2e.harness import LiveConsole, login, screenshot
from tests.evals.review_helpers import finished_run, version_pair

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
def small_runs_may_be_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The console process reads it at start: the review helper's run scores 3 samples."""
    monkeypatch.setenv("EVAL_MIN_SCORED_SAMPLES", "3")


def test_evaluator_reviews_a_sample_with_the_keyboard_and_signs_the_run_off(
    live_console: LiveConsole, browser_page: Any, evaluator_user: User
) -> None:
    _, child = version_pair()
    run = finished_run(candidate=child)
    q0, q1 = (run.samples.get(case_key=key) for key in ("q0", "q1"))
    page = browser_page
    login(page, evaluator_user.username, PASSWORD)
    page.goto(f"/evaluations/runs/{run.pk}")

    expect(page.get_by_test_id("summary-flips")).to_contain_text("1 right → wrong · 0 wrong → right")
    expect(page.get_by_test_id("summary-kl")).to_contain_text("teacher-forced")
    # The helper's listings hold each distribution whole (two tokens, all the mass): an exact KL, said so.
    assert run.summary["distributions"]["teacher_forced"]["method"] == "full_vocabulary"
    expect(page.get_by_test_id("kl-method-teacher_forced")).to_contain_text("exact: both sides listed")
    expect(page.get_by_test_id("kl-quantiles-teacher_forced")).to_contain_text("p99.9")
    flips = run.summary["flips"]
    expect(page.get_by_test_id("summary-mcnemar")).to_contain_text(
        f"McNemar exact p = {flips['mcnemar_p']:.3f}"
    )
    expect(page.get_by_test_id("summary-mcnemar")).to_contain_text(f"recovery {flips['recovery']:.1f} %")
    tags = page.get_by_test_id("tag-table")
    for tag in ("geo", "math", "free"):
        expect(tags).to_contain_text(tag)
    expect(page.get_by_test_id("verdict-current")).to_have_attribute("data-decision", "")
    table = page.get_by_test_id("samples-table")
    for key in ("q0", "q1", "q2"):
        expect(table).to_contain_text(key)
    view = page.get_by_test_id("sample-view")
    expect(view).to_have_attribute("data-sample", str(q0.pk))  # the first sample opens

    # j: the next sample, side by side: "4" against "5", parting at token 0.
    page.keyboard.press("j")
    expect(view).to_have_attribute("data-sample", str(q1.pk))
    diff = view.get_by_test_id("word-diff-text")
    expect(diff.locator("del")).to_have_text("4")
    expect(diff.locator("ins")).to_have_text("5")
    expect(view.get_by_test_id("reference-tokens").get_by_test_id("divergence-mark")).to_have_count(1)
    # 3: mark it a regression.
    page.keyboard.press("3")
    expect(view.get_by_test_id("sample-mark")).to_have_attribute("data-mark", "regression")
    expect(page.get_by_test_id("mark-counts")).to_contain_text("1 regression")
    review = EvalReview.objects.get(sample=q1)
    assert (review.mark, review.marked_by_name) == ("regression", evaluator_user.username)

    # The mark survives a reload.
    page.reload()
    expect(table.locator("tr", has_text="q1")).to_contain_text("regression")

    # The export carries the mark.
    with page.expect_download() as download:
        page.get_by_test_id("export-csv").click()
    assert download.value.suggested_filename == f"eval-run-{run.pk}-samples.csv"
    rows = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text())))
    assert [(r["case_id"], r["mark"]) for r in rows] == [("q0", ""), ("q1", "regression"), ("q2", "")]

    # Sign it off, beside what the verdict rests on.
    expect(page.get_by_test_id("verdict-counts")).to_have_text("3 scored · 0 failed of 3")
    page.get_by_label("Verdict comment").fill("One regression in three; within budget.")
    page.get_by_role("button", name="Accept run").click()
    verdict_bar = page.get_by_test_id("verdict-current")
    expect(verdict_bar).to_have_attribute("data-decision", "accept")
    expect(verdict_bar).to_contain_text(evaluator_user.username)
    expect(verdict_bar).to_contain_text("One regression in three")
    screenshot(page, "eval-run-review-signed")
    verdict = EvalVerdict.objects.get(run=run)
    assert (verdict.decision, verdict.candidate_version_id, verdict.signed_by_name) == (
        "accept",
        child.pk,
        evaluator_user.username,
    )
    audit = AuditEvent.objects.get(object_type="models_registry.evalrun", object_id=str(run.pk))
    assert audit.actor_name == evaluator_user.username and audit.after is not None
    assert audit.after["verdict"] == "accept" and audit.after["marks"]["regression"] == 1

    # The candidate version's page shows the verdict, linked to the run.
    page.get_by_test_id("run-summary").get_by_role("link", name="review-model@q4").click()
    verdicts = page.get_by_test_id("version-verdicts")
    expect(verdicts).to_contain_text("accepted")
    expect(verdicts).to_contain_text(evaluator_user.username)
    expect(verdicts).to_contain_text("One regression in three")
    verdicts.get_by_role("link", name="review run · review-suite v1").click()
    expect(page).to_have_url(f"{live_console.url}/evaluations/runs/{run.pk}")

    # And the audit log lists the sign-off.
    page.goto("/audit?object_type=models_registry.evalrun")
    expect(page.get_by_test_id("audit-table")).to_contain_text("review run")
    expect(page.get_by_test_id("audit-table")).to_contain_text(evaluator_user.username)


def test_a_viewer_sees_the_review_but_cannot_mark_or_sign(
    live_console: LiveConsole, browser_page: Any, viewer_user: User
) -> None:
    run = finished_run()
    page = browser_page
    login(page, viewer_user.username, PASSWORD)
    page.goto(f"/evaluations/runs/{run.pk}")
    view = page.get_by_test_id("sample-view")
    expect(view).to_be_visible()
    page.keyboard.press("j")
    expect(view).to_have_attribute("data-sample", str(run.samples.get(case_key="q1").pk))
    page.keyboard.press("3")  # no effect for a viewer
    for name in ("Accept run", "Reject run", "Regression 3", "Same 1"):
        expect(page.get_by_role("button", name=name)).to_have_count(0)
    expect(view.get_by_test_id("sample-mark")).to_have_attribute("data-mark", "")
    assert not EvalReview.objects.exists()


def push_until_shown(group: str, event: dict[str, Any], shown: Any) -> None:
    """Push `event` until the page shows it: the page's subscription may land just after the socket opens."""
    for _ in range(20):
        # Playwright's sync API keeps an event loop in this thread, where async_to_sync refuses to run.
        worker = threading.Thread(target=push_live_event, args=(group, event))
        worker.start()
        worker.join(timeout=10)
        try:
            shown(500)
            return
        except AssertionError:  # expect() raises it when the text does not come in time
            continue
    shown(1000)


def test_a_running_run_shows_live_progress_and_opens_sign_off_when_it_finishes(
    live_console: LiveConsole, browser_page: Any, evaluator_user: User, redis_clean: None
) -> None:
    run = finished_run(state=RunState.RUNNING)
    EvalRun.objects.filter(pk=run.pk).update(done_count=1)
    page = browser_page
    login(page, evaluator_user.username, PASSWORD)
    page.goto(f"/evaluations/runs/{run.pk}")
    progress = page.get_by_test_id("progress-text")
    expect(progress).to_have_text("1 of 3 cases")
    expect(page.get_by_role("button", name="Accept run")).to_be_disabled()
    expect(page.get_by_test_id("run-live")).to_have_attribute("data-connected", "true")

    group = run_group(run.pk)
    progress_event = {
        "type": "eval_run.progress",
        "run": run.pk,
        "state": "running",
        "done": 2,
        "errors": 0,
        "total": 3,
    }
    push_until_shown(
        group, progress_event, lambda ms: expect(progress).to_have_text("2 of 3 cases", timeout=ms)
    )

    # The run ends: the last event makes the page fetch it again, and sign-off opens.
    EvalRun.objects.filter(pk=run.pk).update(state=RunState.COMPLETED, done_count=3)
    finished = {**progress_event, "state": "completed", "done": 3}
    push_until_shown(
        group, finished, lambda ms: expect(page.get_by_test_id("run-progress")).to_have_count(0, timeout=ms)
    )
    expect(page.get_by_role("button", name="Accept run")).to_be_enabled()
