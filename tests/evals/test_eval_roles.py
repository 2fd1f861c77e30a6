"""Every evaluation route, for every role: evaluators create suites, start runs, review and sign off;
viewers read; anonymous callers get 401. The routes are read from the router, so a new evaluation route
that this table does not cover fails the test instead of going unchecked."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from rest_framework.test import APIClient

from console.choices import Role
from console.models import User
from models_registry.api.urls import router
from models_registry.evaluation.models import EvalCase, EvalRun, EvalSuite, RunState
from models_registry.evaluation.suites import import_jsonl
from nodes.models import Deployment, Host
from tests.conftest import client_for, make_user
from tests.evals.review_helpers import finished_run, version_pair
from tests.evals.run_helpers import MODEL
from vllm_sim.testing import SimHandle

pytestmark = pytest.mark.django_db

EVAL_ROUTE_PREFIXES = ("evalsuite-", "evalsuiteversion-", "evalcase-", "evalrun-")
EXTRA_ROUTES = {("modelversion-verdicts", "get")}  # the version page's list of verdicts


@dataclass
class World:
    """Fresh objects for one role's walk: each write hits its own object, so every call can succeed."""

    suite: EvalSuite
    spare_suite: EvalSuite
    draft: int  # a draft (unused) suite version with cases
    spare_draft: int  # another draft: one of its cases, then the version itself, are deleted
    case: EvalCase
    spare_case: EvalCase
    run: EvalRun  # completed, with samples
    running: EvalRun
    failed: EvalRun
    sample: int
    candidate_version: int
    candidate_deployment: int  # deployed, as is its lineage parent (the default reference)
    engine_url: str  # a running engine: a new run's sides must answer


def build_world(engine_url: str) -> World:
    suite = EvalSuite.objects.create(name="roles")
    lines = "\n".join(json.dumps({"id": f"c{i}", "prompt": f"Say {i}."}) for i in range(3))
    draft = import_jsonl(suite, lines)
    spare_draft = import_jsonl(suite, lines)  # its case and then itself are deleted
    parent, child = version_pair()
    host = Host.objects.create(name="roles-host", address="127.0.0.1")
    deployments = {
        version.revision: Deployment.objects.create(
            name=f"roles-{version.revision}",
            model_version=version,
            host=host,
            port=18600 + i,
            served_model_name="m",
            state="ready",
            start_token=f"token-{i}",
            engine="sim",
        )
        for i, version in enumerate((parent, child))
    }
    run = finished_run(candidate=child, suite_name="roles-run")
    return World(
        suite=suite,
        spare_suite=EvalSuite.objects.create(name="roles-spare"),
        draft=draft.pk,
        spare_draft=spare_draft.pk,
        case=draft.cases.get(case_id="c0"),
        spare_case=spare_draft.cases.get(case_id="c1"),
        run=run,
        running=finished_run(state=RunState.RUNNING, suite_name="roles-running"),
        failed=finished_run(state=RunState.FAILED, suite_name="roles-failed"),
        sample=int(run.samples.get(case_key="q1").pk),
        candidate_version=child.pk,
        candidate_deployment=deployments[child.revision].pk,
        engine_url=engine_url,
    )


# (route name, method) -> (path, body, status for a role that may write). Reads answer 200.
Call = tuple[str, dict[str, Any] | None, int]


def calls(w: World) -> dict[tuple[str, str], Call]:
    new_run = {
        "suite_version": w.draft,
        "reference_base_url": w.engine_url,
        "reference_model": MODEL,
        "candidate_base_url": w.engine_url,
        "candidate_model": MODEL,
    }
    run, sample = w.run.pk, w.sample
    return {
        ("evalsuite-list", "get"): ("/api/eval-suites/", None, 200),
        ("evalsuite-list", "post"): ("/api/eval-suites/", {"name": "made-by-role"}, 201),
        ("evalsuite-import-suite", "post"): (
            "/api/eval-suites/import/",
            {"name": "imported-by-role", "jsonl": json.dumps({"id": "i1", "prompt": "Hi"})},
            201,
        ),
        ("evalsuite-detail", "get"): (f"/api/eval-suites/{w.suite.pk}/", None, 200),
        ("evalsuite-detail", "put"): (
            f"/api/eval-suites/{w.suite.pk}/",
            {"name": "roles", "description": "p"},
            200,
        ),
        ("evalsuite-detail", "patch"): (f"/api/eval-suites/{w.suite.pk}/", {"description": "x"}, 200),
        ("evalsuite-upload", "post"): (
            f"/api/eval-suites/{w.suite.pk}/upload/",
            {"jsonl": json.dumps({"id": "u1", "prompt": "Hi"})},
            201,
        ),
        ("evalsuiteversion-list", "get"): ("/api/eval-suite-versions/", None, 200),
        ("evalsuiteversion-detail", "get"): (f"/api/eval-suite-versions/{w.draft}/", None, 200),
        ("evalsuiteversion-copy", "post"): (f"/api/eval-suite-versions/{w.draft}/copy/", {}, 201),
        ("evalsuiteversion-export", "get"): (f"/api/eval-suite-versions/{w.draft}/export/", None, 200),
        ("evalcase-list", "get"): ("/api/eval-cases/", None, 200),
        ("evalcase-list", "post"): (
            "/api/eval-cases/",
            {"version": w.draft, "case_id": "new", "prompt": "P"},
            201,
        ),
        ("evalcase-detail", "get"): (f"/api/eval-cases/{w.case.pk}/", None, 200),
        ("evalcase-detail", "put"): (
            f"/api/eval-cases/{w.case.pk}/",
            {"version": w.draft, "case_id": "c0", "prompt": "Say zero."},
            200,
        ),
        ("evalcase-detail", "patch"): (f"/api/eval-cases/{w.case.pk}/", {"tags": ["t"]}, 200),
        ("evalrun-list", "get"): ("/api/eval-runs/", None, 200),
        ("evalrun-default-reference", "get"): (
            f"/api/eval-runs/default-reference/?candidate_deployment={w.candidate_deployment}",
            None,
            200,
        ),
        ("evalrun-detail", "get"): (f"/api/eval-runs/{run}/", None, 200),
        ("evalrun-samples", "get"): (f"/api/eval-runs/{run}/samples/", None, 200),
        ("evalrun-sample-mark", "post"): (
            f"/api/eval-runs/{run}/samples/{sample}/mark/",
            {"mark": "regression", "comment": "wrong"},
            200,
        ),
        ("evalrun-sample-mark", "delete"): (f"/api/eval-runs/{run}/samples/{sample}/mark/", None, 200),
        ("evalrun-verdicts", "get"): (f"/api/eval-runs/{run}/verdicts/", None, 200),
        ("evalrun-sign", "post"): (
            f"/api/eval-runs/{run}/sign/",
            {"decision": "accept", "comment": "ok"},
            201,
        ),
        ("evalrun-export", "get"): (f"/api/eval-runs/{run}/export/csv/", None, 200),
        ("evalrun-cancel", "post"): (f"/api/eval-runs/{w.running.pk}/cancel/", {}, 200),
        ("evalrun-resume", "post"): (f"/api/eval-runs/{w.failed.pk}/resume/", {}, 202),
        # Creating a run locks `draft`, so it comes after the case edits and before the deletes.
        ("evalrun-list", "post"): ("/api/eval-runs/", new_run, 201),
        ("modelversion-verdicts", "get"): (f"/api/model-versions/{w.candidate_version}/verdicts/", None, 200),
        ("evalcase-detail", "delete"): (f"/api/eval-cases/{w.spare_case.pk}/", None, 204),
        ("evalsuiteversion-detail", "delete"): (f"/api/eval-suite-versions/{w.spare_draft}/", None, 204),
        ("evalsuite-detail", "delete"): (f"/api/eval-suites/{w.spare_suite.pk}/", None, 204),
    }


def routed() -> set[tuple[str, str]]:
    """(route name, method) of every evaluation route the registry's router serves."""
    out = set()
    for pattern in router.urls:
        name = getattr(pattern, "name", None) or ""
        if name.startswith(EVAL_ROUTE_PREFIXES):
            methods = set(getattr(pattern.callback, "actions", {})) - {"head", "options"}  # head: a GET
            out |= {(name, method) for method in methods}
    return out | EXTRA_ROUTES


def test_the_table_covers_every_evaluation_route() -> None:
    assert set(calls(build_world("http://127.0.0.1:9"))) == routed()


@pytest.fixture
def engine_url(reference_sim: SimHandle, settings: Any) -> str:
    """A running engine for new runs, and sign-off allowed on the world's small run: this walk is about
    who may call each route; what a run needs to be accepted is tested in test_review_api."""
    settings.EVAL_MIN_SCORED_SAMPLES = 1
    return reference_sim.base_url


def walk(client: APIClient, expect: Callable[[str, int], int], engine_url: str) -> list[str]:
    """Every call in table order; the mismatches as readable lines."""
    w = build_world(engine_url)
    wrong = []
    for (name, method), (path, body, write_status) in calls(w).items():
        resp = getattr(client, method)(path, body, format="json")
        want = expect(method, write_status)
        if resp.status_code != want:
            wrong.append(f"{method.upper()} {path} ({name}): {resp.status_code}, expected {want}")
    return wrong


@pytest.fixture(autouse=True)
def no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs and resumes send their task to a list, not to a worker."""
    monkeypatch.setattr("models_registry.api.eval_runs.enqueue_evaluation", lambda run_id: None)


@pytest.mark.parametrize(
    "role",
    [Role.ADMIN, Role.EVALUATOR, "superuser"],
)
def test_writers_may_do_everything(role: str, engine_url: str) -> None:
    user = make_user(f"writer-{role}", Role.VIEWER if role == "superuser" else role)
    if role == "superuser":  # a superuser is an admin whatever its role field says
        User.objects.filter(pk=user.pk).update(is_superuser=True)
        user.refresh_from_db()
    assert walk(client_for(user), lambda method, write_status: write_status, engine_url) == []
    run = EvalRun.objects.get(name="review run", suite_version__suite__name="roles-run")
    assert run.verdicts.get().signed_by_name == user.username


def test_viewers_read_everything_and_write_nothing(viewer_user: User, engine_url: str) -> None:
    def expect(method: str, write_status: int) -> int:
        return 200 if method == "get" else 403

    assert walk(client_for(viewer_user), expect, engine_url) == []
    assert not EvalRun.objects.filter(state=RunState.PENDING).exists()
    assert not EvalSuite.objects.filter(name="made-by-role").exists()


def test_anonymous_gets_401_everywhere() -> None:
    assert walk(APIClient(), lambda method, write_status: 401, "http://127.0.0.1:9") == []


def test_every_role_in_the_console_is_covered() -> None:
    """A new role must be added to the walks above (and to RolePermission) before it ships."""
    assert set(Role.values) == {Role.ADMIN, Role.EVALUATOR, Role.VIEWER}
