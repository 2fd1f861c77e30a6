"""When nothing fits, placement help says what would: the largest context the GPUs hold, a quantized
sibling from the registry's lineage, another host, or the share others leave on a taken GPU; and each
alternative, applied, fits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodes.choices import DeploymentState, HostState
from tests.nodes.conftest import make_host, register_llama

pytestmark = pytest.mark.django_db


def _placement(client: Any, **body: Any) -> dict[str, Any]:
    response = client.post("/api/deployments/placement/", body, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def test_nothing_fits_names_context_version_and_host_that_would(
    admin_client: Any, node_settings: Any, awq_config: Any
) -> None:
    small = make_host("a10-host", gpus=1, profile="a10-llama3-8b-int4")
    make_host("h100-host", gpus=1)
    root = Path(node_settings.MODEL_ROOTS[0])
    fp16 = register_llama(root, small.name)
    awq = register_llama(root, small.name, revision="awq", quant=awq_config)
    awq.parent = fp16
    awq.save(update_fields=["parent"])
    request = {"model_version": fp16.pk, "engine": "vllm", "host": small.pk, "max_model_len": 65536}

    body = _placement(admin_client, **request)

    assert body["proposed"] is None
    assert "Nothing fits on a10-host" in body["note"]
    verdict = body["verdict"]
    assert verdict["fits"] is False and verdict["host_name"] == "a10-host"
    assert "fewer than one sequence" in verdict["reason"]
    by_kind = {alt["kind"]: alt for alt in body["alternatives"]}
    assert set(by_kind) == {"context", "version", "host"}
    largest = by_kind["context"]["changes"]["max_model_len"]
    assert largest == verdict["fit"]["max_context_that_fits"] and 16_384 < largest < 65536
    assert by_kind["version"]["changes"]["model_version"] == awq.pk
    assert by_kind["host"]["changes"]["host"] != small.pk

    for alt in body["alternatives"]:
        changes = dict(alt["changes"])
        applied = {**request, **changes}
        if changes.get("quantization", 0) is None:
            applied.pop("quantization")
        again = _placement(admin_client, **applied)
        assert again["verdict"]["fits"] is True, (alt["kind"], again["verdict"]["reason"])


def test_a_taken_gpu_offers_the_share_left(
    admin_client: Any, node_settings: Any, llama_version: Any, make_deployment: Any, host: Any
) -> None:
    make_deployment(state=DeploymentState.READY, gpu_memory_utilization=0.5, host=host, gpu_indices=[0])

    body = _placement(
        admin_client,
        model_version=llama_version.pk,
        engine="sim",
        host=host.pk,
        gpu_indices=[0],
        max_model_len=4096,
    )

    verdict = body["verdict"]
    assert verdict["fits"] is False
    assert "'sim-0' (50%)" in verdict["reason"]
    assert verdict["gpus"][0]["ok"] is False
    (alt,) = [a for a in body["alternatives"] if a["kind"] == "utilization"]
    assert alt["changes"] == {"gpu_memory_utilization": 0.5}
    again = _placement(
        admin_client,
        model_version=llama_version.pk,
        engine="sim",
        host=host.pk,
        gpu_indices=[0],
        max_model_len=4096,
        gpu_memory_utilization=0.5,
    )
    assert again["verdict"]["fits"] is True


def test_a_draining_host_does_not_fit_and_another_host_is_offered(
    admin_client: Any, node_settings: Any, llama_version: Any, host: Any
) -> None:
    other = make_host("node-open", gpus=1)
    host.state = HostState.DRAINING
    host.save(update_fields=["state"])

    body = _placement(
        admin_client,
        model_version=llama_version.pk,
        engine="sim",
        host=host.pk,
        gpu_indices=[0],
        max_model_len=4096,
    )

    verdict = body["verdict"]
    assert verdict["fits"] is False and "draining" in verdict["reason"]
    assert [a["kind"] for a in body["alternatives"]] == ["host"]
    assert body["alternatives"][0]["changes"] == {"host": other.pk, "gpu_indices": [0]}
