"""In the browser, an evaluator uploads a bad suite (refused with line-numbered problems, nothing imported),
then a good one, edits a case of the draft, starts a run of a quantized candidate against its lineage
parent (two keyed simulator engines deployed in the fleet) from the New run form, watches it progress live
and finish in the runs list with its accuracy and flips, opens the run's page, marks a sample with the
keyboard and signs the run off. A viewer sees the same
pages without a write action; an evaluator cancels a run from the list."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from playwright.sync_api import expect

from console.models import User
from core.models import AuditEvent
from models_registry.evaluation.models import (
    EvalCase,
    EvalReview,
    EvalRun,
    EvalSuite,
    EvalVerdict,
    RunState,
)
from models_registry.evaluation.suites import import_jsonl
from models_registry.models import Model, ModelVersion
from nodes.lifecycle import engine_api_key
from nodes.models import Deployment, Host
from tests.conftest import PASSWORD
from tests.e2e.harness import login, screenshot, subprocess_database_url
from vllm_sim.testing import REPO_ROOT, SimHandle, free_port, start_sim

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("redis_clean")]


@pytest.fixture(autouse=True)
def suite_size_may_be_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The console process reads it at start: accepting the run of CASES cases is allowed."""
    monkeypatch.setenv("EVAL_MIN_SCORED_SAMPLES", str(CASES))


MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CASES = 16
SLOW_MS = 60_000  # a run on a busy two-core box

BAD_JSONL = "\n".join(
    [
        json.dumps({"id": "a", "prompt": "2 + 2?", "expected": "4", "match_rule": "numeric"}),
        "{not json",
        json.dumps({"id": "b", "expected": "x", "match_rule": "exact"}),
        json.dumps({"id": "c", "prompt": "Pick", "expected": "B", "match_rule": "fuzzy"}),
        json.dumps({"id": "a", "prompt": "again"}),
    ]
)


@pytest.fixture
def fleet_pair() -> Iterator[tuple[Deployment, Deployment, SimHandle]]:
    """A full-precision version and its quantized child, each deployed (ready) on a keyed simulator; the
    child's engine drifts (--sim-quality-drift), so some answers flip.

    Yields the reference deployment, the candidate deployment and the reference's simulator."""
    model = Model.objects.create(name="llama-e2e")
    parent = ModelVersion.objects.create(
        model=model, revision="fp16", source_kind="directory", source_path="/m/fp16", state="verified"
    )
    child = ModelVersion.objects.create(
        model=model,
        revision="q4",
        source_kind="directory",
        source_path="/m/q4",
        parent=parent,
        state="verified",
    )
    host = Host.objects.create(name="eval-e2e", address="127.0.0.1")
    deps, sims = [], []
    try:
        for version, drift in ((parent, "0"), (child, "0.3")):
            dep = Deployment.objects.create(
                name=f"llama-{version.revision}",
                model_version=version,
                host=host,
                port=free_port(),
                served_model_name=MODEL,
                state="ready",
                start_token=secrets.token_hex(8),
                engine="sim",
            )
            # Real time (time_scale 1): the run lasts a few seconds, long enough to see it move.
            sims.append(
                start_sim(
                    MODEL,
                    "--max-model-len",
                    "4096",
                    "--sim-quality-drift",
                    drift,
                    port=dep.port,
                    api_key=engine_api_key(dep),
                    time_scale=1.0,
                )
            )
            deps.append(dep)
        yield deps[0], deps[1], sims[0]
    finally:
        for sim in sims:
            sim.stop()


@pytest.fixture
def celery_worker(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A real Celery worker on the control queue, sharing this test's database and Redis keys."""
    env = {
        **os.environ,
        "DATABASE_URL": subprocess_database_url(),
        "PYTHONPATH": str(REPO_ROOT),
        "REDIS_KEY_PREFIX": settings.REDIS_KEY_PREFIX,
    }
    env.pop("TEST_DATABASE_NAME", None)
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    cmd = [sys.executable, "-m", "celery", "-A", "core", "worker", "-Q", "control", "--pool", "solo"]
    cmd += ["--without-heartbeat", "--without-mingle", "--without-gossip", "-l", "warning"]
    log = tmp_path / "worker.log"
    worker = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    yield worker
    worker.terminate()
    try:
        worker.wait(10)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait(10)


def answer_lines(reference: SimHandle) -> str:
    """A suite whose expected answers come from the reference: even cases expect its first token (the
    reference is right), odd ones its second choice there (wrong); the drifted candidate flips both ways."""
    lines = []
    for i in range(CASES):
        prompt = f"Question {i}: name one thing"
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0,
            "seed": 0,
            "max_tokens": 16,
            "logprobs": True,
            "top_logprobs": 2,
        }
        req = urllib.request.Request(
            reference.base_url + "/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {reference.api_key}"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            first = json.loads(resp.read())["choices"][0]["logprobs"]["content"][0]
        token = first["token"] if i % 2 == 0 else first["top_logprobs"][1]["token"]
        lines.append(
            {
                "id": f"q{i}",
                "prompt": prompt,
                "expected": r"\A" + re.escape(token),
                "match_rule": "regex",
                "tags": ["even" if i % 2 == 0 else "odd"],
            }
        )
    return "\n".join(json.dumps(line) for line in lines) + "\n"


def test_upload_suites_then_run_a_candidate_against_its_parent(
    browser_page: Any,
    evaluator_user: User,
    fleet_pair: tuple[Deployment, Deployment, SimHandle],
    celery_worker: subprocess.Popen[bytes],
    tmp_path: Path,
) -> None:
    reference, candidate, reference_sim = fleet_pair
    bad = tmp_path / "bad.jsonl"
    bad.write_text(BAD_JSONL)
    good = tmp_path / "good.jsonl"
    good.write_text(answer_lines(reference_sim))
    page = browser_page
    login(page, evaluator_user.username, PASSWORD)

    page.get_by_role("link", name="Evaluations").click()
    page.get_by_role("navigation", name="Evaluations").get_by_role("link", name="Suites").click()
    expect(page).to_have_url(re.compile(r"/evaluations/suites$"))

    # A bad file: every problem with its line, and nothing imported (no suite either).
    page.get_by_role("button", name="Upload suite").click()
    dialog = page.get_by_test_id("upload-suite-dialog")
    dialog.get_by_label("Suite name").fill("e2e-answers")
    dialog.get_by_label("JSONL file").set_input_files(str(bad))
    dialog.get_by_role("button", name="Upload").click()
    problems = dialog.get_by_test_id("upload-line-errors")
    expect(problems).to_contain_text("Nothing was imported.")
    expect(problems.locator("li[data-line='2']")).to_contain_text("Invalid JSON")
    expect(problems.locator("li[data-line='3']")).to_contain_text("Missing prompt")
    expect(problems.locator("li[data-line='4']")).to_contain_text("Unknown match rule 'fuzzy'")
    expect(problems.locator("li[data-line='5']")).to_contain_text("Duplicate id 'a' (first used on line 1)")
    screenshot(page, "evaluations-upload-refused", full_page=False)
    assert not EvalSuite.objects.filter(name="e2e-answers").exists() and EvalCase.objects.count() == 0

    # The good file: the suite's page, v1 a draft with every case.
    dialog.get_by_label("JSONL file").set_input_files(str(good))
    expect(problems).to_have_count(0)
    dialog.get_by_role("button", name="Upload").click()
    expect(page).to_have_url(re.compile(r"/evaluations/suites/\d+$"))
    suite = EvalSuite.objects.get(name="e2e-answers")
    versions = page.get_by_test_id("versions-table")
    expect(versions.get_by_test_id("version-1")).to_be_visible()
    expect(versions).to_contain_text("draft")
    cases = page.get_by_test_id("cases-table")
    expect(cases.locator("tbody tr")).to_have_count(CASES)
    expect(cases).to_contain_text("Question 0: name one thing")

    # A draft's case is edited in place; a field error shows beside its field and changes nothing.
    cases.get_by_role("button", name="Edit q1", exact=True).click()
    edit = page.get_by_test_id("case-dialog")
    edit.get_by_label("Match rule").select_option("")
    edit.get_by_role("button", name="Save case").click()
    expect(edit.locator(".field-invalid")).to_contain_text('needs a "match_rule"')
    edit.get_by_label("Match rule").select_option("regex")
    edit.get_by_label("Tags").fill("odd, edited")
    edit.get_by_role("button", name="Save case").click()
    expect(edit).to_have_count(0)
    q1 = cases.locator("tr", has=page.get_by_role("button", name="Edit q1", exact=True))
    expect(q1).to_contain_text("edited")
    assert EvalCase.objects.get(version__suite=suite, case_id="q1").tags == ["odd", "edited"]
    screenshot(page, "evaluations-suite-draft")

    # The New run form, from the version's Run… button: the API's default reference is named.
    versions.get_by_role("link", name="Run…").click()
    form = page.get_by_test_id("new-run-dialog")
    expect(form.get_by_label("Suite version")).to_have_value(str(suite.versions.get().pk))
    form.get_by_label("Name").fill("q4 vs fp16")
    form.get_by_label("Candidate").select_option(str(candidate.pk))
    expect(form.get_by_test_id("reference-hint")).to_contain_text("Default: llama-fp16 (llama-e2e@fp16)")
    # The API's field errors land beside their fields; no run is made.
    form.get_by_label("Max tokens").fill("0")
    form.get_by_role("button", name="Start run").click()
    expect(form.locator(".field-invalid", has_text="Max tokens")).to_contain_text(
        "greater than or equal to 1"
    )
    assert EvalRun.objects.count() == 0
    form.get_by_label("Max tokens").fill("16")
    form.get_by_label("Concurrency").fill("2")
    form.get_by_role("button", name="Start run").click()
    expect(form).to_have_count(0)

    run = EvalRun.objects.get()
    assert (run.reference_deployment_id, run.candidate_deployment_id) == (reference.pk, candidate.pk)
    table = page.get_by_test_id("runs-table")
    row = table.locator("tr", has=page.get_by_test_id(f"run-link-{run.pk}"))
    expect(row).to_contain_text("llama-fp16 (llama-e2e@fp16)")
    expect(row).to_contain_text("llama-q4 (llama-e2e@q4)")
    expect(row).to_contain_text(evaluator_user.username)

    # Progress moves while the worker runs (live events), then the run finishes with its figures.
    progress = page.get_by_test_id(f"run-progress-{run.pk}")
    seen: set[int] = set()
    deadline = time.monotonic() + SLOW_MS / 1000
    while time.monotonic() < deadline:
        seen.add(int(progress.get_attribute("data-done") or 0))
        if row.locator("[data-status='completed']").count():
            break
        page.wait_for_timeout(100)
    expect(row.locator("[data-status='completed']")).to_be_visible()
    expect(progress).to_have_attribute("data-done", str(CASES))
    assert any(0 < done < CASES for done in seen), f"no progress seen between 0 and {CASES}: {sorted(seen)}"
    expect(page.get_by_test_id("runs-live")).to_have_attribute("data-connected", "true")
    run.refresh_from_db()
    flips = run.summary["flips"]
    figures = page.get_by_test_id(f"run-figures-{run.pk}")
    expect(figures).to_contain_text(f"{flips['right_to_wrong']} ↓")
    expect(figures).to_contain_text(f"{flips['wrong_to_right']} ↑")
    expect(figures).to_contain_text(f"flips of {CASES}")
    assert run.state == RunState.COMPLETED and run.error_count == 0
    screenshot(page, "evaluations-run-finished")

    # The suite's version is locked now: no more case edits, a copy makes a new draft.
    page.goto(f"/evaluations/suites/{suite.pk}")
    expect(page.get_by_test_id("versions-table")).to_contain_text("locked")
    expect(
        page.get_by_test_id("cases-table").get_by_role("button", name="Edit q1", exact=True)
    ).to_have_count(0)
    page.get_by_role("button", name="Copy to draft").click()
    expect(page.get_by_test_id("version-2")).to_be_visible()
    expect(page.get_by_test_id("suite-cases")).to_contain_text("Cases of v2")
    expect(
        page.get_by_test_id("cases-table").get_by_role("button", name="Edit q1", exact=True)
    ).to_be_visible()

    # The run's page (the review) is where a run's link leads.
    page.get_by_role("link", name="Evaluations").click()
    page.get_by_test_id(f"run-link-{run.pk}").click()
    expect(page).to_have_url(re.compile(rf"/evaluations/runs/{run.pk}$"))

    # Review the run just made, with the keyboard: j moves to the second sample, 2 marks it acceptable.
    first, second = run.samples.order_by("position")[:2]
    view = page.get_by_test_id("sample-view")
    expect(view).to_have_attribute("data-sample", str(first.pk))
    page.keyboard.press("j")
    expect(view).to_have_attribute("data-sample", str(second.pk))
    page.keyboard.press("2")
    expect(view.get_by_test_id("sample-mark")).to_have_attribute("data-mark", "acceptable")
    expect(page.get_by_test_id("mark-counts")).to_contain_text("1 acceptable")
    assert EvalReview.objects.get(sample=second).mark == "acceptable"

    # What greedy meant for each side is on the page (both are simulated vLLM engines).
    expect(page.get_by_test_id("greedy-candidate")).to_contain_text("temperature 0 · top_p 1")
    expect(page.get_by_test_id("greedy-candidate")).to_contain_text("repetition_penalty 1")

    # And sign it off: the verdict is stored, audited and shown.
    expect(page.get_by_test_id("verdict-counts")).to_have_text(f"{CASES} scored · 0 failed of {CASES}")
    page.get_by_label("Verdict comment").fill("Drift within budget for this suite.")
    page.get_by_role("button", name="Accept run").click()
    expect(page.get_by_test_id("verdict-current")).to_have_attribute("data-decision", "accept")
    verdict = EvalVerdict.objects.get(run=run, superseded_at__isnull=True)
    assert verdict.decision == "accept"
    assert verdict.candidate_version_id == run.candidate_info["model_version_id"]
    assert AuditEvent.objects.filter(
        object_type="models_registry.evalrun", object_id=str(run.pk), after__verdict="accept"
    ).exists()
    screenshot(page, "evaluations-run-signed")


def test_viewers_read_and_evaluators_cancel(
    browser_page: Any, viewer_user: User, evaluator_user: User
) -> None:
    suite = EvalSuite.objects.create(name="readable")
    version = import_jsonl(suite, json.dumps({"id": "q", "prompt": "Say hi."}) + "\n")
    version.lock()
    run = EvalRun.objects.create(
        name="waiting",
        suite_version=version,
        reference_base_url="http://127.0.0.1:9",
        reference_model="ref",
        candidate_base_url="http://127.0.0.1:9",
        candidate_model="cand",
        case_count=1,
    )
    page = browser_page
    login(page, viewer_user.username, PASSWORD)
    page.goto("/evaluations")
    row = page.get_by_test_id("runs-table").locator("tr", has_text="waiting")
    expect(row).to_contain_text("pending")
    expect(row).to_contain_text("ref at http://127.0.0.1:9")
    for name in ("New run", "Cancel"):
        expect(page.get_by_role("button", name=name)).to_have_count(0)
    page.goto(f"/evaluations/suites/{suite.pk}")
    expect(page.get_by_test_id("cases-table")).to_contain_text("Say hi.")
    for name in ("Upload new version", "Copy to draft", "Delete", "Add case", "Edit q"):
        expect(page.get_by_role("button", name=name)).to_have_count(0)
    expect(page.get_by_role("link", name="Run…")).to_have_count(0)
    page.goto("/evaluations/suites")
    expect(page.get_by_test_id("suites-table")).to_contain_text("readable")
    expect(page.get_by_role("button", name="Upload suite")).to_have_count(0)
    screenshot(page, "evaluations-viewer")

    page.get_by_role("button", name="Sign out").click()
    login(page, evaluator_user.username, PASSWORD)
    page.goto("/evaluations")
    row = page.get_by_test_id("runs-table").locator("tr", has_text="waiting")
    row.get_by_role("button", name="Cancel").click()
    expect(row).to_contain_text("cancelling…")
    expect(row.get_by_role("button", name="Cancel")).to_have_count(0)
    assert EvalRun.objects.get(pk=run.pk).cancel_requested
