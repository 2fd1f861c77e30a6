"""Lists carry live values from Redis, with a bounded number of queries whatever the row count."""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.redis_client import get_redis
from nodes.lifecycle import live_deployment_key, live_gpu_key

pytestmark = pytest.mark.django_db


def test_deployment_list_has_live_values_and_no_n_plus_one(
    admin_client: Any, make_deployment: Any, redis_clean: None, django_assert_max_num_queries: Any
) -> None:
    deployments = [make_deployment(gpu_memory_utilization=0.1) for _ in range(6)]
    get_redis().set(
        live_deployment_key(deployments[2].pk), json.dumps({"state": "ready", "tokens_per_s": 42.0})
    )
    with django_assert_max_num_queries(4):
        body = admin_client.get("/api/deployments/").json()
    assert body["count"] == 6
    live = {row["id"]: row["live"] for row in body["results"]}
    assert live[deployments[2].pk] == {"state": "ready", "tokens_per_s": 42.0}
    assert all(value is None for key, value in live.items() if key != deployments[2].pk)


def test_host_list_has_live_gpu_samples(admin_client: Any, host: Any, redis_clean: None) -> None:
    get_redis().set(live_gpu_key(host.name, 0), json.dumps({"utilization_pct": 55.0, "simulated": True}))
    body = admin_client.get("/api/hosts/").json()
    assert body["results"][0]["gpus"][0]["live"] == {"utilization_pct": 55.0, "simulated": True}
