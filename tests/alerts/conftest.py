"""Fixtures for alerts tests: a host and deployments with fabricated live records in the real Redis."""

from __future__ import annotations

import datetime as dt
from typing import Any

import orjson
import pytest

from core.redis_client import get_redis
from models_registry.models import Model, ModelVersion
from nodes.choices import DeploymentState, DesiredState, Engine
from nodes.lifecycle import live_deployment_key, live_gpu_key
from nodes.models import Deployment, Host
from tests.nodes.conftest import make_host

T0 = 1_900_000_000.0  # a fixed clock: every evaluation passes its own `now`


def at(t: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(t, dt.UTC)


def heartbeat(host: Host, t: float) -> None:
    Host.objects.filter(pk=host.pk).update(last_heartbeat=at(t))


def publish_engine(deployment: Deployment, **fields: Any) -> None:
    """The live record the agent writes for a scraped engine (nodes/agent/supervisor.py's fields)."""
    record = {"has_metrics": True, "num_requests_running": 0, "num_requests_waiting": 0, **fields}
    get_redis().set(live_deployment_key(deployment.pk), orjson.dumps(record), ex=300)


def publish_gpu(host: Host, index: int, **fields: Any) -> None:
    record = {"memory_used_bytes": 10 * 1024**3, "memory_total_bytes": 80 * 1024**3, **fields}
    get_redis().set(live_gpu_key(host.name, index), orjson.dumps(record), ex=300)


@pytest.fixture
def alert_host(db: None) -> Host:
    host = make_host("alert-node")
    heartbeat(host, T0)
    return host


@pytest.fixture
def version(db: None) -> ModelVersion:
    return ModelVersion.objects.create(
        model=Model.objects.create(name="Llama-3.1-8B-Instruct"),
        revision="fp16",
        source_kind="directory",
        source_path="/srv/models/llama",
        state="verified",
    )


@pytest.fixture
def make_engine(alert_host: Host, version: ModelVersion) -> Any:
    counter = iter(range(100))

    def build(**fields: Any) -> Deployment:
        n = next(counter)
        values: dict[str, Any] = {
            "name": f"eng-{n}",
            "model_version": version,
            "engine": Engine.SIM,
            "host": alert_host,
            "gpu_indices": [0],
            "port": 19000 + n,
            "served_model_name": "llama-3.1-8b",
            "state": DeploymentState.READY,
            "desired_state": DesiredState.RUNNING,
        }
        values.update(fields)
        return Deployment.objects.create(**values)

    return build
