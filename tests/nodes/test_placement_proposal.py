"""Placement help shows each GPU's free memory as the fit check counts it (total less what running
deployments reserve), proposes GPUs that fit, and the proposal passes the very checks create runs."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from models_registry.estimate import DEFAULT_OVERHEAD_BYTES
from nodes.choices import DeploymentState
from tests.nodes.conftest import make_host

pytestmark = pytest.mark.django_db


def _placement(client: Any, **body: Any) -> dict[str, Any]:
    response = client.post("/api/deployments/placement/", body, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def test_free_memory_per_gpu_counts_what_others_reserve(
    admin_client: Any, node_settings: Any, llama_version: Any, make_deployment: Any, host: Any
) -> None:
    second = make_host("node-b", gpus=2)
    make_deployment(state=DeploymentState.READY, gpu_memory_utilization=0.45, host=host, gpu_indices=[0])
    make_deployment(state=DeploymentState.STOPPED, gpu_memory_utilization=0.9, host=second, gpu_indices=[1])

    body = _placement(admin_client, engine="sim")

    hosts = {h["host_name"]: h for h in body["hosts"]}
    (gpu,) = hosts["node-a"]["gpus"]
    total = 81559 * 1024**2
    assert gpu["memory_total_bytes"] == total
    assert gpu["reserved_fraction"] == pytest.approx(0.45)
    assert gpu["free_bytes"] == int(total * 0.55)
    assert [h["deployment"] for h in gpu["holders"]] == ["sim-0"]
    # A stopped deployment holds nothing.
    assert [g["free_bytes"] for g in hosts["node-b"]["gpus"]] == [total, total]
    assert body["verdict"] is None  # no version chosen yet: free memory only


def test_proposal_takes_the_free_gpu_and_passes_preflight(
    admin_client: Any, node_settings: Any, llama_version: Any, make_deployment: Any
) -> None:
    host = make_host("node-two", gpus=2)
    make_deployment(state=DeploymentState.READY, gpu_memory_utilization=0.9, host=host, gpu_indices=[0])

    body = _placement(
        admin_client, model_version=llama_version.pk, engine="sim", host=host.pk, max_model_len=8192
    )

    proposed = body["proposed"]
    assert (proposed["host_name"], proposed["gpu_indices"], proposed["lowered_utilization"]) == (
        "node-two",
        [1],
        False,
    )
    verdict = body["verdict"]
    assert verdict["fits"] is True and verdict["gpu_indices"] == [1]
    assert body["alternatives"] == []
    # The whole arithmetic: needed = weights + KV of one full-length sequence + overhead, and units say
    # which values are tokens (never shown as bytes).
    lines = {line["label"]: line for line in verdict["lines"]}
    kv = lines["KV cache per token"]["value"] * 8192
    assert lines["KV cache of one full-length sequence"]["value"] == kv
    assert lines["needed in all"]["value"] == lines["weights"]["value"] + kv + DEFAULT_OVERHEAD_BYTES
    assert lines["context (max_model_len)"]["unit"] == "tokens"
    steps = {step["label"]: step["unit"] for step in verdict["fit"]["steps"]}
    assert steps["KV cache tokens"] == steps["largest context that fits"] == "tokens"
    assert steps["weights"] == "bytes"

    check = admin_client.post(
        "/api/deployments/preflight/",
        {
            "model_version": llama_version.pk,
            "engine": "sim",
            "host": proposed["host"],
            "gpu_indices": proposed["gpu_indices"],
            "gpu_memory_utilization": proposed["gpu_memory_utilization"],
            "max_model_len": 8192,
            "port": 18650,
        },
        format="json",
    ).json()
    assert check["ok"] is True, check["errors"]


def test_shared_gpu_is_proposed_at_the_share_left_when_nothing_is_whole(
    admin_client: Any, node_settings: Any, llama_version: Any, make_deployment: Any, host: Any
) -> None:
    make_deployment(state=DeploymentState.READY, gpu_memory_utilization=0.4, host=host, gpu_indices=[0])

    body = _placement(
        admin_client, model_version=llama_version.pk, engine="sim", host=host.pk, max_model_len=4096
    )

    proposed = body["proposed"]
    assert proposed["gpu_indices"] == [0] and proposed["lowered_utilization"] is True
    assert proposed["gpu_memory_utilization"] == pytest.approx(0.6)
    assert body["verdict"]["fits"] is True


def test_llamacpp_takes_no_gpu_placement(
    admin_client: Any, node_settings: Any, llama_version: Any, host: Any
) -> None:
    body = _placement(admin_client, model_version=llama_version.pk, engine="llamacpp", host=host.pk)
    assert body["engine_uses_gpus"] is False
    assert (body["proposed"], body["verdict"], body["alternatives"]) == (None, None, [])
    assert "CPU" in body["note"]


def test_queries_do_not_grow_with_the_fleet(
    admin_client: Any, node_settings: Any, llama_version: Any, make_deployment: Any, host: Any
) -> None:
    make_deployment(state=DeploymentState.READY, gpu_memory_utilization=0.45, host=host, gpu_indices=[0])
    body = {"model_version": llama_version.pk, "engine": "sim", "max_model_len": 8192}

    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            _placement(admin_client, **body)
        return len(queries)

    one = count()
    for n in range(4):
        make_host(f"more-{n}", gpus=2)
    assert count() == one
