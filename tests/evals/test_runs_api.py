"""The runs API: each route per role, field errors on bad input, sample filters, and fleet deployments
resolved through the registry's injected resolver (the lineage parent as the default reference)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from rest_framework.test import APIClient

from models_registry.evaluation.models import GREEDY_VLLM, EvalRun, EvalSuite, EvalSuiteVersion, RunState
from models_registry.evaluation.runner import execute_run
from models_registry.evaluation.suites import import_jsonl
from models_registry.models import Model, ModelVersion
from nodes.lifecycle import engine_api_key
from nodes.models import Deployment, Host
from tests.evals.run_helpers import MODEL, answer_suite, make_run
from vllm_sim.testing import SimHandle, free_port, start_sim

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_clean")]


@pytest.fixture
def enqueued(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Run ids the API sent to the task queue (on commit), instead of sending them to a worker."""
    sent: list[int] = []
    monkeypatch.setattr("models_registry.api.eval_runs.enqueue_evaluation", sent.append)
    return sent


def small_version() -> EvalSuiteVersion:
    suite = EvalSuite.objects.create(name="two")
    cases = [
        {"id": "a", "prompt": "Say a."},
        {"id": "b", "prompt": "2+2?", "expected": "4", "match_rule": "numeric"},
    ]
    return import_jsonl(suite, "\n".join(json.dumps(c) for c in cases))


@pytest.fixture
def engines(reference_sim: SimHandle, drifted_sim: SimHandle) -> dict[str, str]:
    """Base URLs of two running engines: a run's sides must answer when it is created."""
    return {"reference": reference_sim.base_url, "candidate": drifted_sim.base_url}


def body(version: EvalSuiteVersion, engines: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {
        "suite_version": version.pk,
        "reference_base_url": engines["reference"],
        "reference_model": MODEL,
        "candidate_base_url": engines["candidate"],
        "candidate_model": MODEL,
        "max_tokens": 16,
        "seed": 7,
        **extra,
    }


def test_evaluators_and_admins_start_runs_viewers_read(
    evaluator_client: APIClient,
    admin_client: APIClient,
    viewer_client: APIClient,
    anon_client: APIClient,
    enqueued: list[int],
    engines: dict[str, str],
) -> None:
    version = small_version()
    assert anon_client.post("/api/eval-runs/", body(version, engines), format="json").status_code == 401
    assert viewer_client.post("/api/eval-runs/", body(version, engines), format="json").status_code == 403
    assert EvalRun.objects.count() == 0 and not EvalSuiteVersion.objects.get(pk=version.pk).locked
    created = evaluator_client.post("/api/eval-runs/", body(version, engines, name="first"), format="json")
    assert created.status_code == 201, created.json()
    run = created.json()
    assert run["state"] == "pending" and run["case_count"] == 2 and run["suite_name"] == "two"
    # Greedy as each side's engine means it: both simulators list themselves as vLLM (owned_by).
    assert run["reference_info"]["engine"] == run["candidate_info"]["engine"] == "vllm"
    assert run["candidate_info"]["greedy"] == GREEDY_VLLM  # recorded with the run
    greedy = {"reference": GREEDY_VLLM, "candidate": GREEDY_VLLM}
    assert run["sampling"] == {
        "temperature": 0,
        "seed": 7,
        "max_tokens": 16,
        "top_logprobs": 5,
        "greedy": greedy,
    }
    assert run["live_group"] == f"live.evalrun.{run['id']}"
    assert enqueued == [run["id"]]
    assert EvalSuiteVersion.objects.get(pk=version.pk).locked  # frozen by the run's transaction
    assert admin_client.post("/api/eval-runs/", body(version, engines), format="json").status_code == 201
    for client in (viewer_client, evaluator_client, admin_client):
        listed = client.get("/api/eval-runs/")
        assert listed.status_code == 200 and listed.json()["count"] == 2
        assert client.get(f"/api/eval-runs/{run['id']}/").json()["name"] == "first"
        assert client.get(f"/api/eval-runs/{run['id']}/samples/").status_code == 200
    assert anon_client.get("/api/eval-runs/").status_code == 401
    assert viewer_client.post(f"/api/eval-runs/{run['id']}/cancel/").status_code == 403
    assert viewer_client.post(f"/api/eval-runs/{run['id']}/resume/").status_code == 403
    cancelled = evaluator_client.post(f"/api/eval-runs/{run['id']}/cancel/")
    assert cancelled.status_code == 200 and cancelled.json()["cancel_requested"] is True
    assert EvalRun.objects.get(pk=run["id"]).cancel_requested
    EvalRun.objects.filter(pk=run["id"]).update(state=RunState.COMPLETED)
    assert evaluator_client.post(f"/api/eval-runs/{run['id']}/cancel/").status_code == 409
    assert evaluator_client.post(f"/api/eval-runs/{run['id']}/resume/").status_code == 409
    # Runs are not edited or deleted through the API.
    assert admin_client.delete(f"/api/eval-runs/{run['id']}/").status_code == 405
    assert admin_client.patch(f"/api/eval-runs/{run['id']}/", {"name": "x"}, format="json").status_code == 405


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"suite_version": 999999}, "suite_version"),
        ({"candidate_base_url": "", "candidate_model": ""}, "candidate_deployment"),
        ({"candidate_model": ""}, "candidate_model"),
        ({"reference_base_url": ""}, "reference_base_url"),
        ({"candidate_base_url": "not a url"}, "candidate_base_url"),
        (
            {"candidate_deployment": 999999, "candidate_base_url": "", "candidate_model": ""},
            "candidate_deployment",
        ),
        ({"candidate_deployment": 1}, "candidate_deployment"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"temperature": 0.7}, "temperature"),
        # A side that does not answer, or does not serve the model, would fail every request.
        ({"candidate_base_url": "http://127.0.0.1:9"}, "candidate_base_url"),
        ({"reference_model": "no-such-model"}, "reference_base_url"),
    ],
)
def test_bad_input_gets_field_errors_and_no_run(
    evaluator_client: APIClient,
    enqueued: list[int],
    engines: dict[str, str],
    change: dict[str, Any],
    field: str,
) -> None:
    version = small_version()
    resp = evaluator_client.post("/api/eval-runs/", {**body(version, engines), **change}, format="json")
    assert resp.status_code == 400
    assert field in resp.json(), resp.json()
    assert EvalRun.objects.count() == 0 and enqueued == []
    assert not EvalSuiteVersion.objects.get(pk=version.pk).locked


def test_no_reference_and_no_lineage_is_a_field_error(
    evaluator_client: APIClient, enqueued: list[int], engines: dict[str, str]
) -> None:
    version = small_version()
    resp = evaluator_client.post(
        "/api/eval-runs/", body(version, engines, reference_base_url="", reference_model=""), format="json"
    )
    assert resp.status_code == 400 and "reference_deployment" in resp.json()


def test_sample_filters_and_orders(
    viewer_client: APIClient, reference_sim: SimHandle, drifted_sim: SimHandle
) -> None:
    version = answer_suite(reference_sim, 30)
    run = make_run(version, reference_sim, drifted_sim)
    execute_run(run.pk)
    url = f"/api/eval-runs/{run.pk}/samples/"
    every = viewer_client.get(url + "?limit=100").json()
    assert every["count"] == 30 and [s["position"] for s in every["results"]] == list(range(30))
    differs = viewer_client.get(url + "?differs=true&limit=100").json()["results"]
    same = viewer_client.get(url + "?differs=false&limit=100").json()["results"]
    assert differs and all(not s["exact_match"] for s in differs) and len(differs) + len(same) == 30
    flipped = viewer_client.get(url + "?flipped=any&limit=100").json()["results"]
    assert flipped and all(s["flip"] for s in flipped)
    assert len(flipped) == run.samples.exclude(flip="").count()
    r2w = viewer_client.get(url + "?flipped=right_to_wrong&limit=100").json()["results"]
    assert all(s["flip"] == "right_to_wrong" and s["tags"] == ["even"] for s in r2w)
    worst = [s["mean_kl"] for s in viewer_client.get(url + "?order=worst_kl&limit=100").json()["results"]]
    assert worst == sorted(worst, reverse=True) and worst[0] > 0
    odd = viewer_client.get(url + "?tag=odd&limit=100").json()["results"]
    assert len(odd) == 15 and all(s["tags"] == ["odd"] for s in odd)
    bad = viewer_client.get(url + "?order=best")
    assert bad.status_code == 400 and "order" in bad.json()
    assert viewer_client.get(url + "?colour=red").status_code == 400


@pytest.fixture
def fleet_pair(db: None) -> Iterator[tuple[Deployment, Deployment]]:
    """A full-precision version and its quantized child, each deployed on a keyed simulator."""
    model = Model.objects.create(name="llama-eval")
    parent = ModelVersion.objects.create(
        model=model, revision="fp16", source_kind="directory", source_path="/m/a"
    )
    child = ModelVersion.objects.create(
        model=model, revision="q4", source_kind="directory", source_path="/m/b", parent=parent
    )
    host = Host.objects.create(name="eval-host", address="127.0.0.1")
    deps, sims = [], []
    for version, drift in ((parent, "0"), (child, "0.2")):
        dep = Deployment.objects.create(
            name=f"eval-{version.revision}",
            model_version=version,
            host=host,
            port=free_port(),
            served_model_name=MODEL,
            state="ready",
            start_token=secrets.token_hex(8),
            engine="sim",
            launch_argv=["python", "-m", "vllm_sim", "serve", MODEL],
        )
        sims.append(
            start_sim(
                MODEL,
                "--max-model-len",
                "4096",
                "--sim-quality-drift",
                drift,
                port=dep.port,
                api_key=engine_api_key(dep),
                time_scale=50.0,
            )
        )
        deps.append(dep)
    yield deps[0], deps[1]
    for sim in sims:
        sim.stop()


def test_a_candidate_deployment_is_compared_with_its_deployed_lineage_parent(
    evaluator_client: APIClient, enqueued: list[int], fleet_pair: tuple[Deployment, Deployment]
) -> None:
    parent_dep, child_dep = fleet_pair
    version = small_version()
    resp = evaluator_client.post(
        "/api/eval-runs/",
        {"suite_version": version.pk, "candidate_deployment": child_dep.pk, "max_tokens": 16},
        format="json",
    )
    assert resp.status_code == 201, resp.json()
    run = resp.json()
    assert run["reference_deployment_id"] == parent_dep.pk and run["candidate_deployment_id"] == child_dep.pk
    assert run["reference_info"]["revision"] == "fp16" and run["candidate_info"]["revision"] == "q4"
    assert run["candidate_info"]["launch_argv"][:3] == ["python", "-m", "vllm_sim"]
    # The engine keys are resolved at every start and never stored.
    stored = json.dumps(list(EvalRun.objects.filter(pk=run["id"]).values()), default=str)
    assert engine_api_key(parent_dep) not in stored and engine_api_key(child_dep) not in stored
    done = execute_run(run["id"])
    assert done is not None and done.state == RunState.COMPLETED and done.error_count == 0
    assert done.summary["distributions"]["teacher_forced"]["samples"] == 2


def test_a_run_against_a_deployment_that_is_not_ready_is_refused(
    evaluator_client: APIClient, enqueued: list[int], fleet_pair: tuple[Deployment, Deployment]
) -> None:
    parent_dep, child_dep = fleet_pair
    version = small_version()
    Deployment.objects.filter(pk=child_dep.pk).update(state="stopped")
    resp = evaluator_client.post(
        "/api/eval-runs/",
        {
            "suite_version": version.pk,
            "candidate_deployment": child_dep.pk,
            "reference_deployment": parent_dep.pk,
        },
        format="json",
    )
    assert resp.status_code == 400, resp.json()
    assert resp.json()["candidate_deployment"] == [
        "The candidate deployment 'eval-q4' is stopped, not ready: start it, or wait until it is ready, "
        "then start the run."
    ]
    assert EvalRun.objects.count() == 0 and enqueued == []
    assert not EvalSuiteVersion.objects.get(pk=version.pk).locked


def test_a_run_that_lost_more_samples_than_allowed_ends_failed(
    reference_sim: SimHandle, settings: Any
) -> None:
    """Above EVAL_MAX_ERROR_FRACTION failed samples the runner ends a run failed, with the count; at or
    below it, completed with its errors counted."""
    version = answer_suite(reference_sim, 8)
    run = make_run(version, reference_sim, reference_sim)
    execute_run(run.pk)
    run.refresh_from_db()
    assert run.state == RunState.COMPLETED and run.error_count == 0
    # Two of its eight samples failed (as a worker that died after storing them would leave them), and
    # the run is executed again: every case has a sample, so it only judges what it holds.
    cases = list(version.cases.order_by("position").values_list("pk", flat=True))
    run.samples.filter(case_id__in=cases[:2]).update(error="candidate: timed out")
    settings.EVAL_MAX_ERROR_FRACTION = 0.05
    EvalRun.objects.filter(pk=run.pk).update(state=RunState.PENDING)
    done = execute_run(run.pk)
    assert done is not None and (done.state, done.error_count) == (RunState.FAILED, 2)
    assert done.error.startswith("2 of 8 samples failed (25%), above the 5% a run may lose")
    settings.EVAL_MAX_ERROR_FRACTION = 0.25
    EvalRun.objects.filter(pk=run.pk).update(state=RunState.PENDING)
    done = execute_run(run.pk)
    assert done is not None and (done.state, done.error_count, done.error) == (RunState.COMPLETED, 2, "")


def test_resume_retries_failed_requests_and_finishes_a_cancelled_run(
    evaluator_client: APIClient, enqueued: list[int], reference_sim: SimHandle
) -> None:
    version = answer_suite(reference_sim, 6)
    run = make_run(version, reference_sim, reference_sim, request_timeout=2)
    EvalRun.objects.filter(pk=run.pk).update(candidate_base_url="http://127.0.0.1:9")
    execute_run(run.pk)
    run.refresh_from_db()
    # Every request failed: the run measured nothing, so it ends failed, not completed.
    assert run.state == RunState.FAILED and run.error_count == 6
    assert run.error.startswith("All 6 samples failed: no case was scored.")
    # The candidate comes back: resuming removes the failed samples and runs those cases again.
    EvalRun.objects.filter(pk=run.pk).update(candidate_base_url=reference_sim.base_url)
    resp = evaluator_client.post(f"/api/eval-runs/{run.pk}/resume/")
    assert resp.status_code == 202 and resp.json()["state"] == "pending" and enqueued == [run.pk]
    assert run.samples.count() == 0
    execute_run(run.pk)
    run.refresh_from_db()
    assert (run.state, run.done_count, run.error_count, run.attempts) == (RunState.COMPLETED, 6, 0, 2)
    assert run.summary["exact_match_rate"] == 1.0
    assert evaluator_client.post(f"/api/eval-runs/{run.pk}/resume/").status_code == 409

    cancelled = make_run(version, reference_sim, reference_sim, cancel_requested=True)
    execute_run(cancelled.pk)
    assert EvalRun.objects.get(pk=cancelled.pk).state == RunState.CANCELLED
    assert evaluator_client.post(f"/api/eval-runs/{cancelled.pk}/resume/").status_code == 202
    execute_run(cancelled.pk)
    cancelled.refresh_from_db()
    assert cancelled.state == RunState.COMPLETED and cancelled.done_count == 6
    assert not cancelled.cancel_requested
