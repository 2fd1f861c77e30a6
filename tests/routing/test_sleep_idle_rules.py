"""Which idle engines the beat task puts to sleep: a pool keeps one awake unless it scales to zero, a
busy or silent engine never sleeps, a deployment's own threshold applies without any pool."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from core.redis_client import get_redis
from models_registry.models import Model, ModelVersion
from nodes.choices import DeploymentState
from nodes.lifecycle import live_deployment_key
from nodes.models import Deployment, Host
from routing.models import RoutePool
from routing.scaling.sleep import sleep_idle_engines

pytestmark = pytest.mark.django_db


@pytest.fixture
def version(db: None) -> ModelVersion:
    model = Model.objects.create(name="m")
    return ModelVersion.objects.create(model=model, revision="r", source_kind="directory", source_path="/m")


def ready(
    version: ModelVersion, port: int, *, idle_for: float = 100.0, busy: int = 0, **fields: Any
) -> Deployment:
    host, _ = Host.objects.get_or_create(name="h")
    values: dict[str, Any] = {
        "name": f"d{port}",
        "model_version": version,
        "host": host,
        "port": port,
        "served_model_name": "chat",
        "engine": "sim",
        "state": DeploymentState.READY,
        "sleep_enabled": True,
        "launch_argv": ["python", "-m", "vllm_sim", "serve", "m", "--enable-sleep-mode"],
        **fields,
    }
    dep = Deployment.objects.create(**values)
    live = {"num_requests_running": busy, "num_requests_waiting": 0, "idle_since": time.time() - idle_for}
    get_redis().set(live_deployment_key(dep.pk), json.dumps(live))
    return dep


def test_pool_keeps_one_engine_awake(version: ModelVersion, redis_clean: None) -> None:
    RoutePool.objects.create(name="chat", alias="chat", sleep_idle_seconds=60)
    a, b = ready(version, 20001), ready(version, 20002)
    assert sleep_idle_engines() == [a.pk]
    assert b.pk not in sleep_idle_engines()


def test_scale_to_zero_lets_every_engine_sleep(version: ModelVersion, redis_clean: None) -> None:
    RoutePool.objects.create(
        name="chat", alias="chat", sleep_idle_seconds=60, scale_to_zero=True, sleep_level=2
    )
    deps = [ready(version, 20001), ready(version, 20002)]
    assert sleep_idle_engines() == [d.pk for d in deps]


def test_busy_recent_or_silent_engines_stay_awake(version: ModelVersion, redis_clean: None) -> None:
    RoutePool.objects.create(name="chat", alias="chat", sleep_idle_seconds=60, scale_to_zero=True)
    ready(version, 20001, busy=1)
    ready(version, 20002, idle_for=10)
    silent = ready(version, 20003)
    get_redis().delete(live_deployment_key(silent.pk))
    assert sleep_idle_engines() == []


def test_engine_started_without_sleep_mode_is_left_alone_and_marked(
    version: ModelVersion, redis_clean: None
) -> None:
    RoutePool.objects.create(name="chat", alias="chat", sleep_idle_seconds=60, scale_to_zero=True)
    old = ready(version, 20001, sleep_enabled=False, launch_argv=["python", "-m", "vllm_sim", "serve", "m"])
    assert sleep_idle_engines() == []
    old.refresh_from_db()
    assert old.sleep_enabled  # deployed into the pool after it was saved: sleep mode at its next start


def test_own_threshold_without_a_pool(version: ModelVersion, redis_clean: None) -> None:
    mine = ready(version, 20001, sleep_idle_seconds=30, idle_for=40)
    ready(version, 20002, idle_for=40)  # no threshold of its own, no pool: never sleeps
    assert sleep_idle_engines() == [mine.pk]
