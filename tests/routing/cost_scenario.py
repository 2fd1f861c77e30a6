"""A fleet with costs, state histories and a request log whose cost figures are worked out by hand.

Window: the 6 hours before `end`. Hosts: gpu-a ($8/h, 4 GPUs), cpu-b ($1/h, no GPUs).

| deployment | host, GPUs | active in the window | cost | output tokens | $/M |
|---|---|---|---|---|---|
| chat-a | gpu-a [0, 1]: 1/2 | end-6h to end-1h (stopped at end-1h): 5 h | 8 x 1/2 x 5 = 20 | 2,000,000 | 10 |
| chat-b | gpu-a [2]: 1/4 | created end-3h, stopped at end: 3 h | 8 x 1/4 x 3 = 6 | 500,000 | 12 |
| spare-e | gpu-a [3]: 1/4 | created end-2h, stopped at end, no traffic: 2 h | 8 x 1/4 x 2 = 4 | 0 | - |
| idle-c | gpu-a [3] | failed at end-7h: 0 h | (left out) | 0 | - |
| cpu-d | cpu-b, no GPUs: whole host | to end-2h (stopped): 4 h | 1 x 1 x 4 = 4 | 200,000 | 20 |

Pools: chat-a's tokens were 1.5M through chat-fast and 0.5M through chat-long, so its $20 splits 15 / 5;
chat-b's $6 all to chat-fast; spare-e had no traffic and matches only chat-fast (chat-long wants role
long-context): its $4 to chat-fast. chat-fast: 15 + 6 + 4 = $25 over 2.0M tokens = $12.5/M; chat-long:
$5 over 0.5M = $10/M; small (the proxy's implicit pool of the alias "small", which has no pool of its
own): $4 over 0.2M = $20/M. The alias "chat" has pools, so no implicit "chat" pool takes idle costs.

Tenants: acme 1.5M x 12.5/M + 0.5M x 10/M = 18.75 + 5 = $23.75; globex 0.5M x 12.5/M + 0.2M x 20/M =
6.25 + 4 = $10.25, and 100,000 tokens of a static route, unpriced. 23.75 + 10.25 = 34 = 20 + 6 + 4 + 4.
acme's daily budget: 4,000,000 tokens, 1,000,000 used today: 25%.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal

from console.models import Quota, Tenant
from core.redis_client import get_redis
from models_registry.models import Model, ModelVersion
from nodes.choices import DeploymentState, DesiredState, Engine
from nodes.models import Deployment, DeploymentEvent, Gpu, Host
from routing.models import RequestLog, RoutePool
from routing.proxy.limits import budget_key, tenant_scope


@dataclass
class CostScenario:
    end: dt.datetime
    deployments: dict[str, Deployment]
    pools: dict[str, RoutePool]
    tenants: dict[str, Tenant]


def build(end: dt.datetime) -> CostScenario:
    h = dt.timedelta(hours=1)
    model = Model.objects.create(name="cost-llama")
    version = ModelVersion.objects.create(
        model=model, revision="fp16", source_kind="directory", source_path="/models/cost-llama"
    )
    gpu_host = Host.objects.create(name="gpu-a", cost_per_hour=Decimal("8.00"))
    cpu_host = Host.objects.create(name="cpu-b", cost_per_hour=Decimal("1.00"))
    Gpu.objects.bulk_create(Gpu(host=gpu_host, index=i, uuid=f"GPU-cost-{i}") for i in range(4))

    def deployment(
        name: str, host: Host, gpus: list[int], alias: str, created: dt.datetime, state: str, role: str = ""
    ) -> Deployment:
        dep = Deployment.objects.create(
            name=name,
            model_version=version,
            engine=Engine.LLAMACPP if not gpus else Engine.VLLM,
            host=host,
            gpu_indices=gpus,
            port=8100 + len(name),
            served_model_name=alias,
            role=role,
            state=state,
            desired_state=DesiredState.STOPPED if state == DeploymentState.STOPPED else DesiredState.RUNNING,
        )
        Deployment.objects.filter(pk=dep.pk).update(created_at=created)
        dep.refresh_from_db()
        return dep

    def event(dep: Deployment, at: dt.datetime, from_state: str, to_state: str) -> None:
        row = DeploymentEvent.objects.create(deployment=dep, from_state=from_state, to_state=to_state)
        DeploymentEvent.objects.filter(pk=row.pk).update(at=at)

    S = DeploymentState
    chat_a = deployment("chat-a", gpu_host, [0, 1], "chat", end - 10 * h, S.STOPPED)
    event(chat_a, end - 10 * h, S.PENDING, S.STARTING)
    event(chat_a, end - 9 * h, S.STARTING, S.READY)
    event(chat_a, end - 4 * h, S.READY, S.READY)  # a note, not a state change
    event(chat_a, end - 2 * h, S.READY, S.STOPPING)
    event(chat_a, end - 1 * h, S.STOPPING, S.STOPPED)
    # chat-b and spare-e stop at `end`, so a window that ends later (the console's "last 24 h", read
    # a few seconds after building) sees the same figures.
    chat_b = deployment("chat-b", gpu_host, [2], "chat", end - 3 * h, S.STOPPED)
    event(chat_b, end - 3 * h + dt.timedelta(minutes=1), S.PENDING, S.READY)
    event(chat_b, end, S.READY, S.STOPPED)
    spare = deployment("spare-e", gpu_host, [3], "chat", end - 2 * h, S.STOPPED)
    event(spare, end, S.READY, S.STOPPED)
    idle = deployment("idle-c", gpu_host, [3], "chat", end - 8 * h, S.FAILED, role="long-context")
    event(idle, end - 7 * h, S.READY, S.FAILED)
    cpu = deployment("cpu-d", cpu_host, [], "small", end - 20 * h, S.STOPPED)
    event(cpu, end - 2 * h, S.READY, S.STOPPED)

    pools = {
        "chat-fast": RoutePool.objects.create(name="chat-fast", alias="chat"),
        "chat-long": RoutePool.objects.create(name="chat-long", alias="chat", role="long-context"),
    }
    acme = Tenant.objects.create(name="acme")
    globex = Tenant.objects.create(name="globex")
    Quota.objects.create(tenant=acme, daily_token_budget=4_000_000)

    rows = []

    def log(tenant: Tenant, dep: Deployment | None, pool: str, tokens: int, at: dt.datetime) -> None:
        rows.append(
            RequestLog(
                created_at=at,
                tenant_id=tenant.pk,
                tenant_name=tenant.name,
                alias=dep.served_model_name if dep else "static",
                deployment_id=dep.pk if dep else None,
                status=200,
                prompt_tokens=100,
                completion_tokens=tokens,
                route_pool=pool,
            )
        )

    for i in range(6):
        log(acme, chat_a, "chat-fast", 250_000, end - 5 * h + i * 10 * dt.timedelta(minutes=1))
    for i in range(2):
        log(acme, chat_a, "chat-long", 250_000, end - 4 * h + i * dt.timedelta(minutes=1))
    log(globex, chat_b, "chat-fast", 500_000, end - 2 * h)
    log(globex, cpu, "small", 200_000, end - 30 * dt.timedelta(minutes=1))
    log(globex, None, "", 100_000, end - 20 * dt.timedelta(minutes=1))
    log(acme, chat_a, "chat-fast", 999, end - 30 * h)  # before the window (and before a 24 h one)
    RequestLog.objects.bulk_create(rows)
    day = end.astimezone(dt.UTC).strftime("%Y%m%d")
    get_redis().set(budget_key(tenant_scope(acme.pk), day), 1_000_000, ex=3600)
    deployments = {d.name: d for d in (chat_a, chat_b, spare, idle, cpu)}
    return CostScenario(
        end=end, deployments=deployments, pools=pools, tenants={"acme": acme, "globex": globex}
    )
