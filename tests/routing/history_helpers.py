"""A small fleet, its live records and request-log rows, fabricated for the history (rollup) tests."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import orjson
from django.utils import timezone

from console.models import Tenant
from core.redis_client import get_redis
from models_registry.models import Model, ModelAlias, ModelVersion
from nodes.choices import DeploymentState, Engine, HostState
from nodes.lifecycle import live_deployment_key, live_gpu_key
from nodes.models import Deployment, Gpu, Host
from routing.models import MetricRollup, RequestLog, RoutePool
from routing.rollups.services import PACKED_KINDS, packed_row

GIB = 1024**3


@dataclass
class Fleet:
    host: Host
    deployment: Deployment
    pool: RoutePool
    tenant: Tenant
    alias: ModelAlias


def make_fleet(name: str = "hist-a", gpus: int = 2) -> Fleet:
    host = Host.objects.create(
        name=name, address="127.0.0.1", state=HostState.ONLINE, last_heartbeat=timezone.now()
    )
    for index in range(gpus):
        Gpu.objects.create(host=host, index=index, uuid=f"sim-{name}-{index}", memory_total_bytes=80 * GIB)
    version = ModelVersion.objects.create(
        model=Model.objects.create(name=f"model-{name}"),
        revision="fp16",
        source_kind="directory",
        source_path="/srv/models/m",
    )
    deployment = Deployment.objects.create(
        name=f"{name}-engine",
        model_version=version,
        engine=Engine.SIM,
        host=host,
        gpu_indices=[0],
        port=18997,
        served_model_name="llama",
        state=DeploymentState.READY,
    )
    pool = RoutePool.objects.create(name=f"{name}-pool", alias="llama")
    tenant = Tenant.objects.create(name=f"{name}-tenant")
    alias = ModelAlias.objects.create(name=f"{name}-alias", active_version=version)
    return Fleet(host, deployment, pool, tenant, alias)


def publish_gpu(host: str, index: int, **values: float) -> None:
    """A GPU's live record as the agent writes it (docs/nodes.md "Live data")."""
    record = {"ts": 0.0, "simulated": True, "memory_total_bytes": 80 * GIB, **values}
    get_redis().set(live_gpu_key(host, index), orjson.dumps(record), ex=30)


def publish_engine(deployment_id: int, **values: float) -> None:
    record = {"ts": 0.0, "state": "ready", **values}
    get_redis().set(live_deployment_key(deployment_id), orjson.dumps(record), ex=30)


def log_request(
    at: float,
    pool: str,
    tenant_id: int | None,
    status: int = 200,
    prompt_tokens: int = 100,
    completion_tokens: int | None = 20,
    latency_ms: float = 100.0,
) -> RequestLog:
    return RequestLog.objects.create(
        created_at=dt.datetime.fromtimestamp(at, dt.UTC),
        tenant_id=tenant_id,
        alias="llama",
        route_pool=pool,
        status=status,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        latency_ms=latency_ms,
    )


def put_point(resolution: int, kind: str, subject: str, ts: float, values: Any, host: str = "") -> None:
    """One history point as the rollup code keeps it: a GPU (`<host>:<index>`) or an engine (its id, on
    `host`) as a member of its host's row, a pool or tenant as a row of its own."""
    at = dt.datetime.fromtimestamp(ts, dt.UTC)
    if kind not in PACKED_KINDS:
        MetricRollup.objects.create(
            resolution_s=resolution, kind=kind, subject=subject, bucket=at, values=values
        )
        return
    row, member = packed_row(kind, subject, host)
    point, created = MetricRollup.objects.get_or_create(
        resolution_s=resolution, kind=kind, subject=row, bucket=at, defaults={"values": {member: values}}
    )
    if not created:
        point.values[member] = values
        point.save(update_fields=["values"])
