"""Fleet lists and the fleet summary at 1,000 hosts and 5,000 engines: server-side paging with totals,
sorting, filtering and search, and a summary (counts, hosts down named, per-pool aggregates, the busiest
engines and hottest GPUs) whose numbers come from the rows and live records the test wrote."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.utils import timezone

from core.redis_client import get_redis
from models_registry.models import Model, ModelVersion
from nodes.lifecycle import live_deployment_key, live_gpu_key
from nodes.models import Deployment, Gpu, Host

pytestmark = pytest.mark.django_db

HOSTS, ENGINES, GPUS = 1000, 5000, 8
DOWN = {7, 123, 999}  # hosts without a recent heartbeat
NEVER = {500}  # a host whose agent never started


@pytest.fixture
def big_fleet(redis_clean: None) -> dict[str, Any]:
    now = timezone.now()
    models = [Model.objects.create(name=f"fleet-model-{m}") for m in range(2)]
    versions = [
        ModelVersion.objects.create(
            model=m, revision="main", source_kind="directory", source_path="/models/x"
        )
        for m in models
    ]
    hosts = Host.objects.bulk_create(
        Host(
            name=f"gpu-{h:04d}",
            address=f"10.1.{h // 250}.{h % 250}",
            role="prefill" if h % 10 == 0 else "",
            state="unknown" if h in NEVER else ("unreachable" if h in DOWN else "online"),
            last_heartbeat=None if h in NEVER else now - dt.timedelta(seconds=3600 if h in DOWN else 1),
        )
        for h in range(HOSTS)
    )
    Gpu.objects.bulk_create(
        Gpu(host=host, index=i, uuid=f"GPU-{h}-{i}", name="H100", memory_total_bytes=80 * 2**30)
        for h, host in enumerate(hosts)
        for i in range(GPUS)
    )
    deployments = Deployment.objects.bulk_create(
        Deployment(
            name=f"chat-{d:04d}",
            model_version=versions[d % 2],
            host=hosts[d % HOSTS],
            gpu_indices=[d // HOSTS],
            port=8100 + d // HOSTS,
            served_model_name=f"chat-{d % 3}",
            state="ready" if d % 50 else "stopped",
        )
        for d in range(ENGINES)
    )
    return {"hosts": hosts, "deployments": deployments, "versions": versions}


def test_hosts_page_with_totals_sorting_filters_and_search(
    admin_client: Any, big_fleet: dict[str, Any]
) -> None:
    last = admin_client.get("/api/hosts/", {"limit": 50, "offset": 950, "ordering": "name"}).json()
    assert last["count"] == HOSTS and last["next"] is None
    assert [h["name"] for h in last["results"]] == [f"gpu-{h:04d}" for h in range(950, 1000)]
    first = admin_client.get("/api/hosts/", {"limit": 25, "ordering": "-name"}).json()
    assert first["results"][0]["name"] == "gpu-0999" and first["next"] is not None
    assert len(first["results"][0]["gpus"]) == GPUS

    down = admin_client.get("/api/hosts/", {"down": "true", "limit": 100}).json()
    assert sorted(h["name"] for h in down["results"]) == [f"gpu-{h:04d}" for h in sorted(DOWN | NEVER)]
    assert admin_client.get("/api/hosts/", {"down": "false", "limit": 1}).json()["count"] == HOSTS - 4
    assert admin_client.get("/api/hosts/", {"role": "prefill", "limit": 1}).json()["count"] == 100
    assert admin_client.get("/api/hosts/", {"state": "unreachable", "limit": 1}).json()["count"] == len(DOWN)
    assert admin_client.get("/api/hosts/", {"search": "gpu-012", "limit": 100}).json()["count"] == 10


def test_deployments_page_by_model_host_state_and_search(
    admin_client: Any, big_fleet: dict[str, Any]
) -> None:
    page = admin_client.get("/api/deployments/", {"limit": 50, "offset": 4950, "ordering": "name"}).json()
    assert page["count"] == ENGINES and [d["name"] for d in page["results"]][-1] == "chat-4999"
    by_model = admin_client.get(
        "/api/deployments/", {"model": "fleet-model-1", "state": "ready", "limit": 1}
    ).json()
    # Odd-numbered deployments run model 1; one in 50 (all even) is stopped.
    assert by_model["count"] == ENGINES // 2
    on_host = admin_client.get("/api/deployments/", {"host_name": "gpu-0042", "ordering": "-port"}).json()
    assert [d["name"] for d in on_host["results"]] == [f"chat-{d:04d}" for d in (4042, 3042, 2042, 1042, 42)]
    assert admin_client.get("/api/deployments/", {"search": "gpu-0042", "limit": 1}).json()["count"] == 5
    stopped = admin_client.get("/api/deployments/", {"state": "stopped", "limit": 1}).json()["count"]
    assert stopped == ENGINES // 50


def test_the_summary_counts_names_the_down_hosts_and_ranks_engines_and_gpus(
    admin_client: Any, viewer_client: Any, big_fleet: dict[str, Any]
) -> None:
    deployments = big_fleet["deployments"]
    r = get_redis()
    busy = {deployments[1].pk: 0.9, deployments[2].pk: 0.95, deployments[4].pk: 0.2}
    for pk, kv in busy.items():
        record = {
            "kv_cache_usage_perc": kv,
            "num_requests_running": 3,
            "num_requests_waiting": 1,
            "tokens_per_s": 10.5,
        }
        r.set(live_deployment_key(pk), json.dumps(record), ex=60)
    r.set(live_gpu_key("gpu-0003", 5), json.dumps({"utilization_pct": 97.0, "temperature_c": 81.0}), ex=60)
    r.set(
        live_gpu_key("gpu-0004", 0), json.dumps({"utilization_pct": 12.0, "memory_used_bytes": 2**30}), ex=60
    )

    body = viewer_client.get("/api/fleet/summary/", {"top": 2}).json()
    assert body["hosts"]["total"] == HOSTS
    assert body["hosts"]["by_state"] == {"online": HOSTS - 4, "unreachable": 3, "unknown": 1}
    assert body["hosts"]["down"] == {"count": 4, "names": ["gpu-0007", "gpu-0123"]}
    assert body["deployments"] == {"total": ENGINES, "by_state": {"ready": ENGINES - 100, "stopped": 100}}
    assert body["gpus"] == {"total": HOSTS * GPUS, "reporting": 2}
    pools = {p["served_model_name"]: p for p in body["pools"]}
    assert {name: (p["engines"], p["ready"]) for name, p in pools.items()} == {
        "chat-0": (1667, 1667 - 34),
        "chat-1": (1667, 1667 - 33),
        "chat-2": (1666, 1666 - 33),
    }
    # deployments 1 and 4 serve chat-1, 2 serves chat-2 (d % 3).
    assert pools["chat-1"]["reporting"] == 2 and pools["chat-1"]["running"] == 6
    assert pools["chat-1"]["kv_cache_usage_mean"] == pytest.approx(0.55)
    assert pools["chat-1"]["kv_cache_usage_max"] == pytest.approx(0.9)
    assert pools["chat-1"]["tokens_per_s"] == pytest.approx(21.0)
    assert pools["chat-0"]["reporting"] == 0 and pools["chat-0"]["kv_cache_usage_mean"] is None
    assert [e["id"] for e in body["busiest_engines"]] == [deployments[2].pk, deployments[1].pk]
    assert [(g["host_name"], g["index"]) for g in body["hottest_gpus"]] == [("gpu-0003", 5), ("gpu-0004", 0)]


def test_a_bad_top_is_refused_naming_the_field(admin_client: Any) -> None:
    for bad in ("0", "101", "many"):
        reply = admin_client.get("/api/fleet/summary/", {"top": bad})
        assert reply.status_code == 400 and "top" in reply.json(), (bad, reply.content)
    assert admin_client.get("/api/fleet/summary/", {"topp": "3"}).status_code == 400  # strict: unknown field
