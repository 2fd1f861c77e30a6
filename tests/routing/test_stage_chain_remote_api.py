"""Remote stages and model classifiers through the admin API: a CPU call's pool must exist, have a ready
deployment and be of role cpu-postprocess; a bad config is refused with the reason, a good one saved."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from routing.models import RoutePool
from tests.routing.test_stage_chain_api import ready_deployment, save

pytestmark = pytest.mark.django_db(transaction=True)

GENERATE = {"kind": "generate"}


def remote(**config: Any) -> dict[str, Any]:
    return {"kind": "remote", "name": "tidy", "config": {"pool": "cpu", "instruction": "Tidy up.", **config}}


def classify(**model: Any) -> dict[str, Any]:
    return {"kind": "classify", "name": "branch", "config": {"model": {"pool": "cpu", **model}}}


@pytest.mark.parametrize(
    ("stages", "reason"),
    [
        ([GENERATE, remote(on_failure="maybe")], "on_failure must be one of open, closed"),
        ([GENERATE, remote(timeout_ms=0)], "timeout_ms must be an integer from 1"),
        ([GENERATE, remote(instruction=" ")], "instruction must say what"),
        ([GENERATE, remote(temperature=1)], "unknown keys: ['temperature']"),
        ([classify(labels={}), GENERATE], "labels must be a non-empty object"),
        ([classify(labels={"a b": "llama"}), GENERATE], "'a b' is not a label"),
    ],
)
def test_a_bad_remote_config_is_refused_with_the_reason(
    admin_client: APIClient, stages: list[dict[str, Any]], reason: str
) -> None:
    ready_deployment("llama")
    ready_deployment("smollm", role="cpu-postprocess")
    RoutePool.objects.create(name="cpu", alias="smollm", role="cpu-postprocess")
    status, body = save(admin_client, stages, alias="llama")
    assert status == 400 and reason in body["stages"][0], body


def test_a_cpu_call_needs_a_ready_pool_of_role_cpu_postprocess(admin_client: APIClient) -> None:
    ready_deployment("llama")
    status, body = save(admin_client, [GENERATE, remote()], alias="llama")
    assert status == 400 and "stage 'tidy' points at no pool named 'cpu'" in body["stages"][0]
    RoutePool.objects.create(name="cpu", alias="smollm", role="cpu-postprocess")
    status, body = save(admin_client, [GENERATE, remote()], alias="llama")
    assert status == 400 and "the pool 'cpu' is empty" in body["stages"][0]
    # A GPU pool is no place for a stage's work, and neither is an alias GPU engines serve too.
    RoutePool.objects.create(name="gpu", alias="llama", role="")
    status, body = save(admin_client, [GENERATE, remote(pool="gpu")], alias="llama")
    assert status == 400 and "needs a pool of role cpu-postprocess" in body["stages"][0]
    status, body = save(admin_client, [GENERATE, remote(pool="llama")], alias="llama")
    assert status == 400 and "needs a pool of role cpu-postprocess" in body["stages"][0]
    labels = {"code": "gpu", "chat": "llama"}
    status, body = save(admin_client, [classify(pool="gpu", labels=labels), GENERATE], alias="llama")
    assert status == 400 and "stage 'branch' points at the pool 'gpu'" in body["stages"][0]
    # With a ready CPU engine the chain is saved, as its own pool or as the served name alone.
    ready_deployment("smollm", role="cpu-postprocess")
    status, body = save(admin_client, [GENERATE, remote()], alias="llama")
    assert status == 201, body
    stages = [classify(pool="smollm", labels=labels), remote(on_failure="closed"), GENERATE, remote()]
    stages[1]["name"] = "annotate"
    status, body = save(admin_client, stages, name="both", alias="other")
    assert status == 201, body
