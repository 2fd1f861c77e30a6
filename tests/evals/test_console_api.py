"""What the console's Evaluations pages need from the API beyond suites and runs themselves: a new suite and
its first version in one request (a refused file leaves no empty suite), the reference a run would get for a
candidate, and runs labelled with their sides and who started them. Each route per role."""

from __future__ import annotations

import json
import secrets
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from console.models import User
from core.models import AuditEvent
from models_registry.evaluation.models import EvalCase, EvalSuite, EvalSuiteVersion
from models_registry.models import Model, ModelVersion
from nodes.models import Deployment, Host
from tests.evals.run_helpers import MODEL
from vllm_sim.testing import SimHandle

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_clean")]

GOOD = (
    json.dumps({"id": "add", "prompt": "2 + 2?", "expected": "4", "match_rule": "numeric"})
    + "\n"
    + json.dumps({"id": "hi", "prompt": "Say hi."})
    + "\n"
)
BAD = GOOD + "{not json\n" + json.dumps({"id": "x", "prompt": "q", "match_rule": "fuzzy", "expected": "a"})


def test_import_makes_a_suite_and_its_first_version(evaluator_client: APIClient) -> None:
    upload = SimpleUploadedFile("mine.jsonl", GOOD.encode(), content_type="application/x-ndjson")
    resp = evaluator_client.post(
        "/api/eval-suites/import/",
        {"name": " mine ", "description": "d", "note": "first", "file": upload},
        format="multipart",
    )
    assert resp.status_code == 201, resp.json()
    suite = resp.json()
    assert (suite["name"], suite["description"], suite["version_count"], suite["builtin"]) == (
        "mine",
        "d",
        1,
        False,
    )
    latest = suite["latest_version"]
    assert (latest["number"], latest["case_count"], latest["note"], latest["locked"]) == (
        1,
        2,
        "first",
        False,
    )
    assert list(EvalCase.objects.filter(version_id=latest["id"]).values_list("case_id", flat=True)) == [
        "add",
        "hi",
    ]
    cases = evaluator_client.get("/api/eval-cases/", {"version": latest["id"]}).json()["results"]
    # A case without an expected answer has no rule: null, as the schema says, not "".
    assert [(c["expected"], c["match_rule"], c["tags"]) for c in cases] == [
        ("4", "numeric", []),
        (None, None, []),
    ]
    assert AuditEvent.objects.filter(object_type__endswith="evalsuite", object_id=str(suite["id"])).exists()


def test_a_refused_import_leaves_no_suite(evaluator_client: APIClient) -> None:
    resp = evaluator_client.post("/api/eval-suites/import/", {"name": "mine", "jsonl": BAD}, format="json")
    assert resp.status_code == 400
    body = resp.json()
    assert [e["line"] for e in body["errors"]] == [3, 4]
    assert body["errors"][0]["message"].startswith("Invalid JSON")
    assert "Unknown match rule 'fuzzy'" in body["errors"][1]["message"]
    assert body["jsonl"][0].startswith("2 problem(s)")
    assert EvalSuite.objects.count() == EvalSuiteVersion.objects.count() == EvalCase.objects.count() == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"jsonl": GOOD}, "name"),
        ({"name": "a/b", "jsonl": GOOD}, "name"),
        ({"name": "taken", "jsonl": GOOD}, "name"),
        ({"name": "fresh"}, "file"),
        ({"name": "fresh", "jsonl": GOOD, "colour": "red"}, "colour"),
    ],
)
def test_import_field_errors(evaluator_client: APIClient, body: dict[str, Any], field: str) -> None:
    EvalSuite.objects.create(name="taken")
    resp = evaluator_client.post("/api/eval-suites/import/", body, format="json")
    assert resp.status_code == 400 and field in resp.json(), resp.json()
    assert EvalSuite.objects.count() == 1 and EvalSuiteVersion.objects.count() == 0


def deploy(version: ModelVersion, host: Host, state: str = "ready") -> Deployment:
    return Deployment.objects.create(
        name=f"dep-{version.revision}-{Deployment.objects.count()}",
        model_version=version,
        host=host,
        port=20000 + Deployment.objects.count(),
        served_model_name="served",
        state=state,
        start_token=secrets.token_hex(8),
        engine="sim",
    )


def test_default_reference_is_the_lineage_parents_ready_deployment(viewer_client: APIClient) -> None:
    model = Model.objects.create(name="llama")
    parent = ModelVersion.objects.create(
        model=model, revision="fp16", source_kind="directory", source_path="/a"
    )
    child = ModelVersion.objects.create(
        model=model, revision="q4", source_kind="directory", source_path="/b", parent=parent
    )
    host = Host.objects.create(name="h", address="127.0.0.1")
    url = "/api/eval-runs/default-reference/"
    orphan = deploy(parent, host)
    candidate = deploy(child, host)
    resp = viewer_client.get(url, {"candidate_deployment": candidate.pk})
    assert resp.status_code == 200, resp.json()
    assert resp.json() == {
        "deployment_id": orphan.pk,
        "label": f"{orphan.name} (llama@fp16)",
        "model_version_id": parent.pk,
    }
    # The parent has no lineage of its own: the answer says why, on the field the form shows.
    no_parent = viewer_client.get(url, {"candidate_deployment": orphan.pk})
    assert no_parent.status_code == 400
    assert "no lineage parent" in no_parent.json()["reference_deployment"][0]
    Deployment.objects.filter(pk=orphan.pk).update(state="stopped")
    not_ready = viewer_client.get(url, {"candidate_deployment": candidate.pk})
    assert not_ready.status_code == 400
    assert "not deployed and ready" in not_ready.json()["reference_deployment"][0]
    missing = viewer_client.get(url, {"candidate_deployment": 999999})
    assert missing.status_code == 400 and "does not exist" in missing.json()["candidate_deployment"][0]
    assert viewer_client.get(url).status_code == 400
    assert viewer_client.get(url, {"candidate_deployment": "x"}).status_code == 400


def test_runs_carry_side_labels_and_their_creator(
    evaluator_client: APIClient,
    evaluator_user: User,
    monkeypatch: pytest.MonkeyPatch,
    reference_sim: SimHandle,
    drifted_sim: SimHandle,
) -> None:
    monkeypatch.setattr("models_registry.api.eval_runs.enqueue_evaluation", lambda run_id: None)
    suite = EvalSuite.objects.create(name="s")
    from models_registry.evaluation.suites import import_jsonl

    version = import_jsonl(suite, GOOD)
    resp = evaluator_client.post(
        "/api/eval-runs/",
        {
            "suite_version": version.pk,
            "reference_base_url": reference_sim.base_url,
            "reference_model": MODEL,
            "candidate_base_url": drifted_sim.base_url + "/",
            "candidate_model": MODEL,
        },
        format="json",
    )
    assert resp.status_code == 201, resp.json()
    run = evaluator_client.get(f"/api/eval-runs/{resp.json()['id']}/").json()
    assert run["reference_label"] == f"{MODEL} at {reference_sim.base_url}"
    assert run["candidate_label"] == f"{MODEL} at {drifted_sim.base_url}"
    assert run["created_by_name"] == evaluator_user.username
    assert (run["suite"], run["suite_version"]) == (suite.pk, version.pk)
    assert run["summary"] == {}


def test_import_and_default_reference_per_role(
    admin_client: APIClient, evaluator_client: APIClient, viewer_client: APIClient, anon_client: APIClient
) -> None:
    def importing(client: APIClient) -> int:
        name = f"suite-{EvalSuite.objects.count()}"
        return int(
            client.post("/api/eval-suites/import/", {"name": name, "jsonl": GOOD}, format="json").status_code
        )

    assert importing(anon_client) == 401
    assert importing(viewer_client) == 403
    assert EvalSuite.objects.count() == 0
    assert importing(evaluator_client) == 201
    assert importing(admin_client) == 201
    url = "/api/eval-runs/default-reference/?candidate_deployment=999999"
    assert anon_client.get(url).status_code == 401
    for client in (viewer_client, evaluator_client, admin_client):
        assert client.get(url).status_code == 400  # read by every role; this one does not exist
