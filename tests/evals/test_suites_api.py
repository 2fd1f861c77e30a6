"""The suites API: upload (file or text), field errors, frozen versions answer 409, each route per role."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from models_registry.evaluation.models import EvalCase, EvalSuite, EvalSuiteVersion
from models_registry.evaluation.suites import import_jsonl

pytestmark = pytest.mark.django_db

CASES = [
    {"id": "add", "prompt": "2 + 2?", "expected": "4", "match_rule": "numeric", "tags": ["math"]},
    {"id": "hello", "prompt": "Say hello."},
]
JSONL = "\n".join(json.dumps(c) for c in CASES) + "\n"


def make_version(name: str = "mine") -> EvalSuiteVersion:
    suite = EvalSuite.objects.create(name=name)
    return import_jsonl(suite, JSONL)


def test_upload_a_file_then_read_it_back(evaluator_client: APIClient) -> None:
    created = evaluator_client.post("/api/eval-suites/", {"name": "smoke", "description": "d"}, format="json")
    assert created.status_code == 201, created.json()
    suite_id = created.json()["id"]
    upload = SimpleUploadedFile("smoke.jsonl", JSONL.encode(), content_type="application/x-ndjson")
    resp = evaluator_client.post(
        f"/api/eval-suites/{suite_id}/upload/", {"file": upload, "note": "first"}, format="multipart"
    )
    assert resp.status_code == 201, resp.json()
    version = resp.json()
    assert (version["number"], version["case_count"], version["locked"]) == (1, 2, False)
    suite = evaluator_client.get(f"/api/eval-suites/{suite_id}/").json()
    assert suite["version_count"] == 1 and suite["latest_version"]["id"] == version["id"]
    cases = evaluator_client.get(f"/api/eval-cases/?version={version['id']}").json()["results"]
    assert [c["case_id"] for c in cases] == ["add", "hello"]
    assert (
        cases[0]["expected"] == "4" and cases[0]["match_rule"] == "numeric" and cases[0]["tags"] == ["math"]
    )
    exported = evaluator_client.get(f"/api/eval-suite-versions/{version['id']}/export/")
    assert exported.status_code == 200
    assert exported["Content-Disposition"] == 'attachment; filename="smoke-v1.jsonl"'
    assert [json.loads(line) for line in exported.content.decode().splitlines()] == CASES


def test_a_bad_upload_answers_400_with_every_line_and_writes_nothing(evaluator_client: APIClient) -> None:
    suite = EvalSuite.objects.create(name="mine")
    bad = JSONL + "not json\n" + json.dumps({"id": "add", "prompt": "dup"}) + "\n"
    resp = evaluator_client.post(f"/api/eval-suites/{suite.pk}/upload/", {"jsonl": bad}, format="json")
    assert resp.status_code == 400
    body = resp.json()
    assert body["errors"][0]["line"] == 3 and body["errors"][0]["message"].startswith("Invalid JSON")
    assert body["errors"][1] == {"line": 4, "message": "Duplicate id 'add' (first used on line 1)."}
    assert body["jsonl"][0].startswith("2 problem(s): line 3: Invalid JSON")
    assert EvalSuiteVersion.objects.count() == 0 and EvalCase.objects.count() == 0


def test_upload_needs_exactly_one_source(evaluator_client: APIClient) -> None:
    suite = EvalSuite.objects.create(name="mine")
    neither = evaluator_client.post(f"/api/eval-suites/{suite.pk}/upload/", {}, format="json")
    assert neither.status_code == 400 and "file" in neither.json()
    unknown = evaluator_client.post(
        f"/api/eval-suites/{suite.pk}/upload/", {"jsonl": JSONL, "cases": []}, format="json"
    )
    assert unknown.status_code == 400 and unknown.json() == {"cases": ["Unknown or read-only field."]}


def test_case_edits_answer_field_errors(evaluator_client: APIClient) -> None:
    version = make_version()
    base: dict[str, Any] = {"version": version.pk, "case_id": "new", "prompt": "Q?"}
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"match_rule": "fuzzy", "expected": "x"}, "match_rule", "Unknown match rule 'fuzzy'"),
        ({"expected": "x"}, "match_rule", 'needs a "match_rule"'),
        ({"expected": "seven", "match_rule": "numeric"}, "expected", "must contain a number"),
        ({"prompt": ""}, "prompt", "Missing prompt"),
        ({"case_id": "add"}, "case_id", "already used"),
        ({"tags": "math"}, "tags", "must be a list"),
        ({"messages": [{"role": "user", "content": "q"}]}, "prompt", "not both"),
    ]
    for change, field, fragment in cases:
        resp = evaluator_client.post("/api/eval-cases/", {**base, **change}, format="json")
        assert resp.status_code == 400, (change, resp.json())
        assert fragment in resp.json()[field][0], (change, resp.json())
    ok = evaluator_client.post(
        "/api/eval-cases/", {**base, "expected": "b", "match_rule": "choice", "tags": ["mc"]}, format="json"
    )
    assert ok.status_code == 201, ok.json()
    assert ok.json()["position"] == 2
    version.refresh_from_db()
    assert version.case_count == 3
    digest = version.digest
    patched = evaluator_client.patch(f"/api/eval-cases/{ok.json()['id']}/", {"expected": "C"}, format="json")
    assert patched.status_code == 200 and patched.json()["expected"] == "C"
    version.refresh_from_db()
    assert version.digest != digest
    to_messages = evaluator_client.patch(
        f"/api/eval-cases/{ok.json()['id']}/",
        {"prompt": "", "messages": [{"role": "user", "content": "Pick one"}]},
        format="json",
    )
    assert to_messages.status_code == 200, to_messages.json()
    assert to_messages.json()["prompt"] == "" and to_messages.json()["messages"][0]["content"] == "Pick one"


def test_a_used_version_answers_409(evaluator_client: APIClient) -> None:
    version = make_version()
    case = version.cases.get(case_id="add")
    version.lock()
    edit = evaluator_client.patch(f"/api/eval-cases/{case.pk}/", {"prompt": "changed"}, format="json")
    assert edit.status_code == 409
    assert "copy it into a new version" in edit.json()["detail"]
    add = evaluator_client.post(
        "/api/eval-cases/", {"version": version.pk, "case_id": "more", "prompt": "p"}, format="json"
    )
    assert add.status_code == 409
    assert evaluator_client.delete(f"/api/eval-cases/{case.pk}/").status_code == 409
    assert evaluator_client.delete(f"/api/eval-suite-versions/{version.pk}/").status_code == 409
    assert evaluator_client.delete(f"/api/eval-suites/{version.suite_id}/").status_code == 409
    assert EvalCase.objects.get(pk=case.pk).prompt == "2 + 2?"
    copied = evaluator_client.post(f"/api/eval-suite-versions/{version.pk}/copy/", {}, format="json")
    assert copied.status_code == 201
    assert (copied.json()["number"], copied.json()["locked"], copied.json()["case_count"]) == (2, False, 2)


def role_targets() -> list[tuple[str, str, Any, int]]:
    """(method, url, body, status for a writer) for every suites route; made fresh per role."""
    version = make_version(name=f"suite-{EvalSuite.objects.count()}")
    frozen = make_version(name=f"frozen-{EvalSuite.objects.count()}")
    frozen.lock()
    case = version.cases.get(case_id="hello")
    spare = EvalSuite.objects.create(name=f"spare-{EvalSuite.objects.count()}")
    return [
        ("get", "/api/eval-suites/", None, 200),
        ("get", f"/api/eval-suites/{version.suite_id}/", None, 200),
        ("post", "/api/eval-suites/", {"name": f"new-{EvalSuite.objects.count()}"}, 201),
        ("patch", f"/api/eval-suites/{version.suite_id}/", {"description": "x"}, 200),
        ("post", f"/api/eval-suites/{version.suite_id}/upload/", {"jsonl": JSONL}, 201),
        ("get", "/api/eval-suite-versions/", None, 200),
        ("get", f"/api/eval-suite-versions/{version.pk}/", None, 200),
        ("get", f"/api/eval-suite-versions/{version.pk}/export/", None, 200),
        ("post", f"/api/eval-suite-versions/{frozen.pk}/copy/", {"note": "n"}, 201),
        ("get", "/api/eval-cases/", None, 200),
        ("get", f"/api/eval-cases/{case.pk}/", None, 200),
        ("post", "/api/eval-cases/", {"version": version.pk, "case_id": "c", "prompt": "p"}, 201),
        ("patch", f"/api/eval-cases/{case.pk}/", {"prompt": "edited"}, 200),
        ("delete", f"/api/eval-cases/{case.pk}/", None, 204),
        ("delete", f"/api/eval-suite-versions/{version.pk}/", None, 204),
        ("delete", f"/api/eval-suites/{spare.pk}/", None, 204),
    ]


@pytest.mark.parametrize("role_client", ["admin_client", "evaluator_client"])
def test_admins_and_evaluators_may_write(role_client: str, request: pytest.FixtureRequest) -> None:
    client: APIClient = request.getfixturevalue(role_client)
    for method, url, body, expected in role_targets():
        resp = getattr(client, method)(url, body, format="json")
        assert resp.status_code == expected, (method, url, resp.status_code, resp.content[:300])


def test_viewers_only_read(viewer_client: APIClient) -> None:
    for method, url, body, _ in role_targets():
        resp = getattr(viewer_client, method)(url, body, format="json")
        assert resp.status_code == (200 if method == "get" else 403), (method, url, resp.status_code)


def test_anonymous_gets_401(anon_client: APIClient) -> None:
    for method, url, body, _ in role_targets():
        assert getattr(anon_client, method)(url, body, format="json").status_code == 401, (method, url)
