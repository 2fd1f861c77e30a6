"""Each engine kind as it is: a launch record names the engine's own version (llama-cpp-python's for
llama.cpp, vLLM's for vLLM), and the fleet summary leaves an engine that serves no metrics out of the KV
cache figures (not reported, not 0 %) and says so."""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.redis_client import get_redis
from nodes.agent.services import engine_spec, launch_record
from nodes.choices import Engine
from nodes.engines import get_adapter
from nodes.lifecycle import live_deployment_key
from nodes.models import DeploymentEvent

pytestmark = pytest.mark.django_db

VERSIONS = {"vllm_version": "0.11.0", "llama_cpp_version": "0.3.36", "nvml": True, "simulated_gpus": False}


@pytest.mark.parametrize(
    ("engine", "version"), [(Engine.LLAMACPP, "0.3.36"), (Engine.VLLM, "0.11.0"), (Engine.SIM, "+sim")]
)
def test_a_launch_record_names_the_engines_own_version(
    admin_client: Any, make_deployment: Any, host: Any, engine: str, version: str
) -> None:
    host.agent_info = VERSIONS
    host.save()
    deployment = make_deployment(engine=engine, gpu_indices=[] if engine == Engine.LLAMACPP else [0])
    spec = engine_spec(deployment)
    argv = get_adapter(engine).build_argv(spec)
    DeploymentEvent.objects.create(deployment=deployment, launch=launch_record(deployment, spec, argv, {}))

    launch = admin_client.get(f"/api/deployments/{deployment.pk}/events/").json()[0]["launch"]
    assert launch["engine"] == engine
    assert launch["engine_version"].endswith(version)


def test_a_record_from_before_engine_version_reads_null(admin_client: Any, make_deployment: Any) -> None:
    deployment = make_deployment()
    old: dict[str, object] = {
        "engine": "vllm",
        "vllm_version": "0.10.1",
        "driver_version": None,
        "cuda_driver_version": None,
        "simulated": False,
        "simulated_engine": False,
        "simulated_gpus": False,
        "manifest_digest": "",
        "model_version": "m",
        "env": {},
        "argv": ["vllm", "serve"],
    }
    DeploymentEvent.objects.create(deployment=deployment, launch=old)
    launch = admin_client.get(f"/api/deployments/{deployment.pk}/events/").json()[0]["launch"]
    assert launch["engine_version"] is None and launch["vllm_version"] == "0.10.1"


def test_an_engine_without_metrics_is_left_out_of_the_kv_cache_figures(
    viewer_client: Any, make_deployment: Any, redis_clean: None
) -> None:
    cpp = make_deployment(engine=Engine.LLAMACPP, gpu_indices=[], served_model_name="pool", state="ready")
    gpu = make_deployment(engine=Engine.VLLM, served_model_name="pool", state="ready")
    r = get_redis()
    # llama.cpp's live record: zeros, because it serves no /metrics (has_metrics false).
    quiet = {"kv_cache_usage_perc": 0.0, "num_requests_waiting": 0, "tokens_per_s": 0.0, "has_metrics": False}
    r.set(live_deployment_key(cpp.pk), json.dumps(quiet), ex=60)
    busy = {"kv_cache_usage_perc": 0.5, "num_requests_waiting": 2, "tokens_per_s": 80.0, "has_metrics": True}
    r.set(live_deployment_key(gpu.pk), json.dumps(busy), ex=60)

    body = viewer_client.get("/api/fleet/summary/").json()
    (pool,) = body["pools"]
    assert pool["reporting"] == 2
    assert pool["kv_cache_usage_mean"] == pytest.approx(0.5)
    engines = {e["id"]: e for e in body["busiest_engines"]}
    assert (engines[cpp.pk]["kv_cache_usage_perc"], engines[cpp.pk]["has_metrics"]) == (None, False)
    assert (engines[gpu.pk]["kv_cache_usage_perc"], engines[gpu.pk]["has_metrics"]) == (0.5, True)
