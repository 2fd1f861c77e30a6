"""The fit check counts a sleeping engine at what sleep mode leaves on its GPU: a GPU a ready engine
fills is refused to a new deployment, and offered once that engine sleeps (either level)."""

from __future__ import annotations

from typing import Any

import pytest

from nodes.choices import DeploymentState

pytestmark = pytest.mark.django_db


def _create(client: Any, version: Any, host: Any) -> Any:
    return client.post(
        "/api/deployments/",
        {
            "name": "newcomer",
            "model_version": version.pk,
            "engine": "sim",
            "host": host.pk,
            "gpu_indices": [0],
            "gpu_memory_utilization": 0.45,
            "port": 18556,
            "served_model_name": "llama-3.1-8b",
            "max_model_len": 4096,
        },
        format="json",
    )


@pytest.mark.parametrize("level", [1, 2])
def test_sleeper_frees_its_gpu_for_the_fit_check(
    admin_client: Any, make_deployment: Any, llama_version: Any, host: Any, level: int
) -> None:
    holder = make_deployment(state=DeploymentState.READY, gpu_memory_utilization=0.9, sleep_enabled=True)
    refused = _create(admin_client, llama_version, host)
    assert refused.status_code == 400 and "already taken" in refused.json()["gpu_indices"][0]
    holder.state, holder.sleeping_level = DeploymentState.SLEEPING, level
    holder.save(update_fields=["state", "sleeping_level"])
    accepted = _create(admin_client, llama_version, host)
    assert accepted.status_code == 201, accepted.content
    # What the sleeper gave back is shown on it: 0.9 of the GPU less the 1 GiB sleep mode keeps.
    data = admin_client.get(f"/api/deployments/{holder.pk}/").json()
    total = 81559 * 1024**2
    assert data["freed_memory_bytes"] == round(0.9 * total - 1024**3)
