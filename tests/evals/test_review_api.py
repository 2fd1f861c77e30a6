"""Review and sign-off through the API: sample marks (one per sample, audited), verdicts (only on a
finished run, superseded not rewritten, audited, listed on the candidate version), the mark filters and
the CSV / JSONL export."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from console.models import User
from core.models import AuditEvent
from models_registry.evaluation.models import EvalReview, EvalRun, EvalVerdict, RunState
from models_registry.evaluation.review import EXPORT_COLUMNS
from tests.evals.review_helpers import CASES, finished_run, version_pair

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def small_runs_may_be_accepted(settings: Any) -> None:
    """The review helper's runs score len(CASES) samples; accepting them is allowed here, and the
    minimum itself is tested below."""
    settings.EVAL_MIN_SCORED_SAMPLES = len(CASES)


def sample_id(run: EvalRun, case: str) -> int:
    return int(run.samples.get(case_key=case).pk)


def streamed(resp: Any) -> str:
    """The body of a streamed download."""
    assert resp.streaming
    return b"".join(resp.streaming_content).decode()


def test_a_mark_is_one_per_sample_replaced_when_marked_again_and_audited(
    evaluator_client: APIClient, evaluator_user: User
) -> None:
    run = finished_run()
    q1 = sample_id(run, "q1")
    url = f"/api/eval-runs/{run.pk}/samples/{q1}/mark/"
    first = evaluator_client.post(url, {"mark": "acceptable", "comment": "close enough"}, format="json")
    assert first.status_code == 200, first.json()
    assert first.json()["review"]["mark"] == "acceptable"
    assert first.json()["review"]["marked_by_name"] == evaluator_user.username
    again = evaluator_client.post(
        url, {"mark": "regression", "comment": "4 is right, 5 is not"}, format="json"
    )
    assert again.json()["review"] == {
        **again.json()["review"],
        "mark": "regression",
        "comment": "4 is right, 5 is not",
    }
    assert EvalReview.objects.filter(sample_id=q1).count() == 1
    events = list(AuditEvent.objects.filter(object_type="models_registry.evalsample", object_id=str(q1)))
    assert [e.action for e in events] == ["update", "create"]  # newest first
    assert events[0].before == {"mark": "acceptable", "comment": "close enough", "marked_by": "eve-evaluator"}
    assert events[0].after is not None and events[0].after["mark"] == "regression"
    assert events[0].actor_name == "eve-evaluator"

    detail = evaluator_client.get(f"/api/eval-runs/{run.pk}/").json()
    assert detail["marks"] == {"same": 0, "acceptable": 0, "regression": 1, "unmarked": 2}

    cleared = evaluator_client.delete(url)
    assert cleared.status_code == 200 and cleared.json()["review"] is None
    assert not EvalReview.objects.exists()
    assert AuditEvent.objects.filter(object_id=str(q1), action="delete").count() == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [({"mark": "worse"}, "mark"), ({}, "mark"), ({"mark": "same", "score": 3}, "score")],
)
def test_a_bad_mark_is_a_field_error_and_writes_nothing(
    evaluator_client: APIClient, body: dict[str, object], field: str
) -> None:
    run = finished_run()
    audited = AuditEvent.objects.count()  # the suite's upload
    resp = evaluator_client.post(
        f"/api/eval-runs/{run.pk}/samples/{sample_id(run, 'q0')}/mark/", body, format="json"
    )
    assert resp.status_code == 400 and field in resp.json(), resp.json()
    assert not EvalReview.objects.exists() and AuditEvent.objects.count() == audited


def test_a_sample_of_another_run_or_one_without_outputs_cannot_be_marked(evaluator_client: APIClient) -> None:
    run = finished_run(error_case=True)
    other = finished_run(suite_name="other-suite")
    foreign = evaluator_client.post(
        f"/api/eval-runs/{run.pk}/samples/{sample_id(other, 'q0')}/mark/", {"mark": "same"}, format="json"
    )
    assert foreign.status_code == 404
    failed = evaluator_client.post(
        f"/api/eval-runs/{run.pk}/samples/{sample_id(run, 'q3')}/mark/", {"mark": "same"}, format="json"
    )
    assert failed.status_code == 409 and "no outputs" in failed.json()["detail"]
    assert not EvalReview.objects.exists()


def test_a_verdict_supersedes_the_last_one_is_audited_and_shows_on_the_candidate_version(
    evaluator_client: APIClient, admin_client: APIClient, viewer_client: APIClient
) -> None:
    _, child = version_pair()
    run = finished_run(candidate=child)
    accepted = evaluator_client.post(
        f"/api/eval-runs/{run.pk}/sign/",
        {"decision": "accept", "comment": "flips both ways, 1 each"},
        format="json",
    )
    assert accepted.status_code == 201, accepted.json()
    verdict = accepted.json()
    assert verdict["decision"] == "accept" and verdict["signed_by_name"] == "eve-evaluator"
    assert verdict["candidate_version"] == child.pk and verdict["current"] is True
    assert viewer_client.get(f"/api/eval-runs/{run.pk}/").json()["verdict"]["id"] == verdict["id"]
    audit = AuditEvent.objects.get(object_type="models_registry.evalrun", object_id=str(run.pk))
    assert audit.action == "action" and audit.actor_name == "eve-evaluator"
    assert audit.after is not None and audit.after["marks"]["unmarked"] == 3
    assert audit.after["verdict"] == "accept" and audit.after["candidate_version"] == child.pk

    rejected = admin_client.post(
        f"/api/eval-runs/{run.pk}/sign/", {"decision": "reject", "comment": "q1 regressed"}, format="json"
    )
    assert rejected.status_code == 201
    history = viewer_client.get(f"/api/eval-runs/{run.pk}/verdicts/").json()
    assert [(v["decision"], v["current"]) for v in history] == [("reject", True), ("accept", False)]
    assert history[1]["superseded_at"] is not None
    assert EvalVerdict.objects.filter(run=run, superseded_at__isnull=True).count() == 1
    latest_audit = AuditEvent.objects.filter(object_type="models_registry.evalrun").first()
    assert latest_audit is not None and latest_audit.before == {
        "verdict": "accept",
        "verdict_id": verdict["id"],
        "comment": "flips both ways, 1 each",
    }

    on_version = viewer_client.get(f"/api/model-versions/{child.pk}/verdicts/").json()
    assert on_version["count"] == 2
    assert [(v["decision"], v["run"], v["suite_name"]) for v in on_version["results"]] == [
        ("reject", run.pk, "review-suite"),
        ("accept", run.pk, "review-suite"),
    ]
    current = viewer_client.get(f"/api/model-versions/{child.pk}/verdicts/?current=true").json()
    assert [v["decision"] for v in current["results"]] == ["reject"]
    assert viewer_client.get(f"/api/model-versions/{child.parent_id}/verdicts/").json()["count"] == 0
    assert viewer_client.get(f"/api/model-versions/{child.pk}/verdicts/?current=maybe").status_code == 400


def test_only_a_finished_run_is_signed_and_only_a_completed_one_accepted(evaluator_client: APIClient) -> None:
    running = finished_run(state=RunState.RUNNING)
    resp = evaluator_client.post(f"/api/eval-runs/{running.pk}/sign/", {"decision": "accept"}, format="json")
    assert resp.status_code == 409 and "running" in resp.json()["detail"]
    cancelled = finished_run(state=RunState.CANCELLED, suite_name="cancelled")
    resp = evaluator_client.post(
        f"/api/eval-runs/{cancelled.pk}/sign/", {"decision": "accept"}, format="json"
    )
    assert resp.status_code == 409 and "Only a completed run" in resp.json()["detail"]
    no_reason = evaluator_client.post(
        f"/api/eval-runs/{cancelled.pk}/sign/", {"decision": "reject"}, format="json"
    )
    assert no_reason.status_code == 400 and "comment" in no_reason.json()
    bad = evaluator_client.post(f"/api/eval-runs/{cancelled.pk}/sign/", {"decision": "maybe"}, format="json")
    assert bad.status_code == 400 and "decision" in bad.json()
    assert not EvalVerdict.objects.exists()
    assert not AuditEvent.objects.filter(object_type="models_registry.evalrun").exists()
    rejected = evaluator_client.post(
        f"/api/eval-runs/{cancelled.pk}/sign/",
        {"decision": "reject", "comment": "stopped early"},
        format="json",
    )
    assert rejected.status_code == 201 and rejected.json()["candidate_version"] is None
    # A signed run is final: resuming it would change the samples under its verdict.
    resume = evaluator_client.post(f"/api/eval-runs/{cancelled.pk}/resume/")
    assert resume.status_code == 409 and "signed off" in resume.json()["detail"]


def test_accepting_needs_enough_scored_samples_and_the_page_counts_the_failed_ones(
    evaluator_client: APIClient, settings: Any
) -> None:
    run = finished_run(error_case=True)  # three scored samples and one whose request failed
    settings.EVAL_MIN_SCORED_SAMPLES = 4
    resp = evaluator_client.post(f"/api/eval-runs/{run.pk}/sign/", {"decision": "accept"}, format="json")
    assert resp.status_code == 409
    assert resp.json()["detail"] == (
        "The run scored 3 sample(s); accepting needs at least 4 (EVAL_MIN_SCORED_SAMPLES). "
        "Run a larger suite, or reject it."
    )
    assert not EvalVerdict.objects.exists()
    # Rejecting needs no minimum: a run too small to pass is still a run someone may turn down.
    rejected = evaluator_client.post(
        f"/api/eval-runs/{run.pk}/sign/", {"decision": "reject", "comment": "too few cases"}, format="json"
    )
    assert rejected.status_code == 201
    settings.EVAL_MIN_SCORED_SAMPLES = 3
    accepted = evaluator_client.post(f"/api/eval-runs/{run.pk}/sign/", {"decision": "accept"}, format="json")
    assert accepted.status_code == 201, accepted.json()
    shown = evaluator_client.get(f"/api/eval-runs/{run.pk}/").json()
    assert (shown["verdict"]["decision"], shown["error_count"], shown["scored_count"]) == ("accept", 1, 3)


def test_samples_filter_by_mark_and_order_by_latest_divergence(evaluator_client: APIClient) -> None:
    run = finished_run()
    evaluator_client.post(
        f"/api/eval-runs/{run.pk}/samples/{sample_id(run, 'q1')}/mark/", {"mark": "regression"}, format="json"
    )
    url = f"/api/eval-runs/{run.pk}/samples/"
    regression = evaluator_client.get(url + "?marked=regression").json()["results"]
    assert [s["case_key"] for s in regression] == ["q1"]
    assert regression[0]["prompt"] == "2+2?" and regression[0]["expected"] == "4"
    assert regression[0]["match_rule"] == "numeric"
    assert [s["case_key"] for s in evaluator_client.get(url + "?marked=none").json()["results"]] == [
        "q0",
        "q2",
    ]
    assert [s["case_key"] for s in evaluator_client.get(url + "?marked=any").json()["results"]] == ["q1"]
    # q2 parts at token 1, q1 at token 0; q0 never parts and is left out.
    latest = evaluator_client.get(url + "?order=latest_divergence").json()["results"]
    assert [(s["case_key"], s["first_divergence"]) for s in latest] == [("q2", 1), ("q1", 0)]
    longest = evaluator_client.get(url + "?order=longest_divergence").json()["results"]
    assert [s["case_key"] for s in longest] == ["q1", "q2"]
    assert evaluator_client.get(url + "?marked=bad").status_code == 400


def test_export_streams_every_sample_with_metrics_and_marks_as_csv_and_jsonl(
    evaluator_client: APIClient, viewer_client: APIClient
) -> None:
    run = finished_run(error_case=True)
    evaluator_client.post(
        f"/api/eval-runs/{run.pk}/samples/{sample_id(run, 'q1')}/mark/",
        {"mark": "regression", "comment": 'wrong, "5"'},
        format="json",
    )
    resp = viewer_client.get(f"/api/eval-runs/{run.pk}/export/csv/", HTTP_ACCEPT="text/csv")
    assert resp.status_code == 200
    assert resp["Content-Type"].startswith("text/csv")
    assert resp["Content-Disposition"] == f'attachment; filename="eval-run-{run.pk}-samples.csv"'
    text = streamed(resp)
    rows = list(csv.DictReader(io.StringIO(text)))
    assert tuple(rows[0].keys()) == EXPORT_COLUMNS
    assert [r["case_id"] for r in rows] == ["q0", "q1", "q2", "q3"]
    q1 = rows[1]
    assert (q1["reference_output"], q1["candidate_output"], q1["flip"]) == ("4", "5", "right_to_wrong")
    assert (q1["reference_correct"], q1["candidate_correct"], q1["exact_match"]) == ("true", "false", "false")
    assert (q1["mark"], q1["mark_comment"], q1["marked_by"]) == ("regression", 'wrong, "5"', "eve-evaluator")
    assert float(q1["mean_kl"]) == pytest.approx(run.samples.get(case_key="q1").mean_kl)
    assert q1["tags"] == '["math"]' and q1["kl_mode"] == "teacher_forced"
    assert rows[3]["error"] and rows[3]["mean_kl"] == "" and rows[0]["mark"] == ""

    jsonl = viewer_client.get(
        f"/api/eval-runs/{run.pk}/export/jsonl/?marked=regression", HTTP_ACCEPT="application/x-ndjson"
    )
    assert jsonl.status_code == 200 and jsonl["Content-Type"].startswith("application/x-ndjson")
    lines = streamed(jsonl).splitlines()
    assert len(lines) == 1  # the sample list's filters apply
    record = json.loads(lines[0])
    assert record["case_id"] == "q1" and record["mark"] == "regression"
    assert record["reference_tokens"] == ["4"] and record["candidate_tokens"] == ["5"]
    assert record["scores"]["flip"] == "right_to_wrong" and len(record["position_kl"]) == 1
    assert set(EXPORT_COLUMNS) <= set(record)
    assert viewer_client.get(f"/api/eval-runs/{run.pk}/export/xml/").status_code == 404
    # Whatever the client accepts, an error is DRF's JSON with the field named.
    bad = viewer_client.get(f"/api/eval-runs/{run.pk}/export/csv/?order=best", HTTP_ACCEPT="text/csv")
    assert bad.status_code == 400 and "order" in bad.json()


def test_the_run_list_counts_marks_and_verdicts_in_a_fixed_number_of_queries(
    viewer_client: APIClient, evaluator_client: APIClient
) -> None:
    def list_queries() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert viewer_client.get("/api/eval-runs/").status_code == 200
        return len(queries)

    for i in range(2):
        run = finished_run(suite_name=f"s{i}")
        evaluator_client.post(f"/api/eval-runs/{run.pk}/sign/", {"decision": "accept"}, format="json")
    few = list_queries()
    for i in range(2, 5):
        run = finished_run(suite_name=f"s{i}")
        evaluator_client.post(
            f"/api/eval-runs/{run.pk}/samples/{sample_id(run, 'q0')}/mark/", {"mark": "same"}, format="json"
        )
        evaluator_client.post(f"/api/eval-runs/{run.pk}/sign/", {"decision": "accept"}, format="json")
    assert list_queries() == few
    listed = viewer_client.get("/api/eval-runs/").json()["results"]
    assert {r["verdict"]["decision"] for r in listed} == {"accept"}
    assert sorted(r["marks"]["same"] for r in listed) == [0, 0, 1, 1, 1]
