"""The deploy check and the registry's fit calculator give the same answer for a multi-GPU deployment.

Before DeploySpec, the deploy check left tensor_parallel_size out of its fit check, so it counted the
per-GPU overhead once for a two-GPU engine while the calculator counted it twice.
"""

from __future__ import annotations

from typing import Any

import pytest

from models_registry.services import fit_check
from nodes.preflight import preflight
from nodes.spec import DeploySpec
from tests.nodes.conftest import free_port, make_host

pytestmark = pytest.mark.django_db


def test_two_gpu_deployment_fit_equals_the_calculator_with_tensor_parallel_two(
    llama_version: Any, node_settings: Any
) -> None:
    host = make_host("node-two", gpus=2)
    spec = DeploySpec.from_values(
        {
            "model_version": llama_version,
            "quantization": None,
            "engine": "sim",
            "host": host,
            "gpu_indices": [0, 1],
            "max_model_len": 8192,
            "max_num_seqs": 32,
            "port": free_port(),
        }
    )
    assert spec.tensor_parallel_size == 2  # the default: one shard per GPU
    check = preflight(spec)
    assert check.ok, check.errors

    both_gpus = sum(g.memory_total_bytes for g in host.gpus.all())
    calculator = fit_check(
        llama_version, None, both_gpus, spec.gpu_memory_utilization, 8192, 32, tensor_parallel_size=2
    )
    one_overhead = fit_check(llama_version, None, both_gpus, spec.gpu_memory_utilization, 8192, 32)
    assert check.fit == calculator
    # The test can tell the two apart: tensor parallelism changes the KV room the calculator finds.
    assert calculator.kv_tokens_available != one_overhead.kv_tokens_available


def test_api_create_and_preflight_store_and_use_the_same_tensor_parallel_default(
    admin_client: Any, llama_version: Any, node_settings: Any
) -> None:
    host = make_host("node-two", gpus=2)
    data = {
        "model_version": llama_version.pk,
        "engine": "sim",
        "host": host.pk,
        "gpu_indices": [0, 1],
        "max_model_len": 8192,
        "max_num_seqs": 32,
        "port": free_port(),
    }
    checked = admin_client.post("/api/deployments/preflight/", data, format="json").json()
    created = admin_client.post(
        "/api/deployments/", {**data, "name": "two-gpu", "served_model_name": "llama"}, format="json"
    )
    assert created.status_code == 201, created.content
    assert created.json()["tensor_parallel_size"] == 2
    assert created.json()["fit"] == checked["fit"]
