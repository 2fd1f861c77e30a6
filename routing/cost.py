"""Cost per output token: hosts' `cost_per_hour` spread over the deployments that hold their GPUs, then
over the tokens those deployments generated, per deployment, per pool and per tenant (docs/monitoring.md
"Cost").

- A deployment's cost over a window is its host's `cost_per_hour` times its share of the host (the GPUs
  it holds over the host's GPUs; the whole host on a host without GPUs) times the hours of the window
  during which it held them: the time it spent in an active state (`nodes.choices.ACTIVE_STATES`:
  pending to stopping, the states in which its GPUs are reserved), read from its state history
  (`DeploymentEvent`). Its output tokens are the completion tokens of the request log's rows with its
  id in the window.
- A pool's cost is the cost of its deployments, each split over the pools that routed requests to it
  in proportion to the output tokens each routed (a deployment no pool used in the window is split
  evenly over the pools whose rule it matches now: its idle time is the pool's capacity cost). A pool's
  output tokens are the completion tokens of the rows routed through it (`route_pool`).
- A tenant's spend is, for each pool, its output tokens through that pool times the pool's cost per
  output token; tokens of requests that no pool routed (static routes) are counted as unpriced.
- A tenant's usage counts admitted work only (`ADMITTED`: what the proxy's limiter charges). Requests
  refused before any answer (scope, quota, rate limit, context checks: a 4xx) and those
  that failed before any answer (a 5xx) carry prompt tokens the proxy counted at the door, but nothing
  was generated for them and the limiter refunds them: they are counted apart, never in its tokens.

Plain functions over the database and the request log; the API views in routing/api/cost.py only parse
the window and serialize what these return.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import Count, F, Q, Sum
from django.utils import timezone

from console.models import Quota, Tenant
from core.redis_client import get_redis
from nodes.choices import ACTIVE_STATES
from nodes.models import Deployment, DeploymentEvent, Gpu
from routing.models import RequestLog, RoutePool
from routing.proxy.limits import budget_key, tenant_scope
from routing.proxy.predict import host_share

PER_MILLION = 1_000_000

# A request-log row of work done: answered below 400, or an answer under way when it failed (the engine
# reported tokens). The same test the limiter uses to keep or refund a reservation
# (routing/proxy/pipeline/account.py). A cache hit is admitted with 0 tokens.
ADMITTED = Q(status__lt=400) | Q(completion_tokens__isnull=False)
REFUSED = ~ADMITTED & Q(status__lt=500)  # 4xx with no answer: scope, quota, limits, context, bad input
FAILED = ~ADMITTED & Q(status__gte=500)  # 5xx with no answer: no engine, engine errors, timeouts


@dataclass(frozen=True)
class Window:
    start: dt.datetime
    end: dt.datetime

    @property
    def hours(self) -> float:
        return (self.end - self.start).total_seconds() / 3600


@dataclass(frozen=True)
class DeploymentCost:
    deployment_id: int
    deployment: str
    host: str
    gpus_held: int
    host_gpus: int
    host_cost_per_hour: float
    running_hours: float
    cost: float
    output_tokens: int
    cost_per_million_output_tokens: float | None  # None: no output tokens in the window


@dataclass(frozen=True)
class PoolCost:
    pool: str
    alias: str
    implicit: bool  # the proxy's pool for an alias without pools of its own (no RoutePool row)
    deployments: list[str]
    cost: float
    output_tokens: int
    cost_per_million_output_tokens: float | None


@dataclass(frozen=True)
class PoolSpend:
    pool: str
    output_tokens: int
    spend: float


@dataclass(frozen=True)
class TenantUsage:
    tenant_id: int
    tenant: str
    requests: int  # admitted ones; refused and failed ones below
    prompt_tokens: int
    output_tokens: int
    refused_requests: int
    refused_prompt_tokens: int  # counted at the door, never billed
    failed_requests: int
    spend: float
    unpriced_output_tokens: int  # routed by no pool (static routes): no cost to charge them
    by_pool: list[PoolSpend]
    daily_token_budget: int | None
    daily_tokens_used: int
    daily_budget_used_ratio: float | None


def per_million(cost: float, tokens: int) -> float | None:
    return cost / tokens * PER_MILLION if tokens > 0 else None


def active_hours(
    created_at: dt.datetime,
    current_state: str,
    events: Iterable[tuple[dt.datetime, str, str]],
    window: Window,
) -> float:
    """Hours of `window` the deployment spent in an active state.

    `events` are its state history as (at, from_state, to_state), oldest first. Before its first event
    it was in that event's from_state (or, with no events, in its current state), from `created_at`.
    """
    history = sorted(events, key=lambda event: event[0])  # stable: same-instant events keep their order
    state = history[0][1] if history else current_state
    since = created_at
    total = 0.0
    for at, _from_state, to_state in [*history, (window.end, "", "")]:
        if state in ACTIVE_STATES:
            begin, end = max(since, window.start), min(at, window.end)
            if end > begin:
                total += (end - begin).total_seconds()
        if at >= window.end:
            break
        if to_state:
            state, since = to_state, at
    return total / 3600


def deployment_costs(window: Window, deployment_ids: Iterable[int] | None = None) -> list[DeploymentCost]:
    """Each deployment's cost, output tokens and cost per million output tokens over `window`.

    Deployments with neither active time nor output tokens in the window are left out.
    """
    deployments = Deployment.objects.select_related("host").filter(created_at__lt=window.end).order_by("name")
    if deployment_ids is not None:
        deployments = deployments.filter(pk__in=list(deployment_ids))
    deployments_list = list(deployments)
    ids = [d.pk for d in deployments_list]
    host_gpus: dict[int, int] = dict(
        Gpu.objects.filter(host_id__in={d.host_id for d in deployments_list})
        .values("host_id")
        .annotate(n=Count("id"))
        .values_list("host_id", "n")
    )
    events: dict[int, list[tuple[dt.datetime, str, str]]] = defaultdict(list)
    for dep_id, at, from_state, to_state in (
        # Events after the window too: the first of them says what state the window ended in.
        DeploymentEvent.objects.filter(deployment_id__in=ids)
        .exclude(from_state=F("to_state"))  # notes and refusals: not state changes
        .order_by("at", "id")
        .values_list("deployment_id", "at", "from_state", "to_state")
    ):
        events[dep_id].append((at, from_state, to_state))
    tokens = _tokens_by(window, "deployment_id", Q(deployment_id__in=ids))
    out = []
    for dep in deployments_list:
        n_gpus = host_gpus.get(dep.host_id, 0)
        held = len(dep.gpu_indices or [])
        share = host_share(held, n_gpus)
        hours = active_hours(dep.created_at, dep.state, events[dep.pk], window)
        rate = float(dep.host.cost_per_hour)
        cost = rate * share * hours
        output = tokens.get(dep.pk, 0)
        if hours == 0 and output == 0:
            continue
        out.append(
            DeploymentCost(
                deployment_id=dep.pk,
                deployment=dep.name,
                host=dep.host.name,
                gpus_held=held,
                host_gpus=n_gpus,
                host_cost_per_hour=rate,
                running_hours=hours,
                cost=cost,
                output_tokens=output,
                cost_per_million_output_tokens=per_million(cost, output),
            )
        )
    return out


def _tokens_by(window: Window, field: str, where: Q) -> dict[object, int]:
    rows = (
        RequestLog.objects.filter(where, created_at__gte=window.start, created_at__lt=window.end)
        .values(field)
        .annotate(out=Sum("completion_tokens"))
        .values_list(field, "out")
    )
    return {key: int(out or 0) for key, out in rows}


@dataclass(frozen=True)
class _Pool:
    name: str
    alias: str
    role: str = ""
    version_id: int | None = None
    implicit: bool = False
    takes_idle: bool = True  # may take a share of an idle deployment's cost

    def matches(self, dep: Deployment) -> bool:
        return (
            self.takes_idle
            and dep.served_model_name == self.alias
            and (not self.role or dep.role == self.role)
            and (self.version_id is None or dep.model_version_id == self.version_id)
        )


def _pools(aliases: Iterable[str], routed_names: Iterable[str]) -> list[_Pool]:
    """The route pools, and the implicit ones the proxy makes (routing/proxy/config.py): one per alias,
    named after it, unless a pool has that name. An implicit pool takes an idle deployment's cost only
    for an alias with no pool of its own; any pool name in the request log is a pool that routed."""
    pools = {
        p.name: _Pool(p.name, p.alias, p.role, p.model_version_id) for p in RoutePool.objects.order_by("name")
    }
    configured = {p.alias for p in pools.values()}
    for alias in set(aliases) - configured:
        pools.setdefault(alias, _Pool(alias, alias, implicit=True))
    for name in routed_names:
        # Routed through a pool named after its alias, but the alias has pools now: not an idle target.
        pools.setdefault(name, _Pool(name, name, implicit=True, takes_idle=False))
    return sorted(pools.values(), key=lambda p: p.name)


def pool_costs(window: Window) -> list[PoolCost]:
    """Each pool's cost, output tokens and cost per million output tokens over `window`."""
    routed: dict[tuple[str, int], int] = {}
    for pool_name, dep_id, out in (
        RequestLog.objects.filter(created_at__gte=window.start, created_at__lt=window.end)
        .exclude(route_pool="")
        .filter(deployment_id__isnull=False)
        .values("route_pool", "deployment_id")
        .annotate(out=Sum("completion_tokens"))
        .values_list("route_pool", "deployment_id", "out")
    ):
        if dep_id is not None:
            routed[(pool_name, dep_id)] = int(out or 0)
    pool_tokens = _tokens_by(window, "route_pool", ~Q(route_pool=""))
    costs = {c.deployment_id: c for c in deployment_costs(window)}
    deployments = {d.pk: d for d in Deployment.objects.filter(pk__in=list(costs))}
    pools = _pools((d.served_model_name for d in deployments.values()), (str(name) for name in pool_tokens))

    cost_of: dict[str, float] = defaultdict(float)
    members: dict[str, set[str]] = defaultdict(set)
    for dep_id, dep_cost in costs.items():
        by_pool = {p: t for (p, d), t in routed.items() if d == dep_id}
        total = sum(by_pool.values())
        if total > 0:
            shares = {p: t / total for p, t in by_pool.items()}
        else:
            matching = [p.name for p in pools if p.matches(deployments[dep_id])]
            shares = {p: 1 / len(matching) for p in matching}
        for pool_name, share in shares.items():
            cost_of[pool_name] += dep_cost.cost * share
            members[pool_name].add(dep_cost.deployment)
    return [
        PoolCost(
            pool=p.name,
            alias=p.alias,
            implicit=p.implicit,
            deployments=sorted(members[p.name]),
            cost=cost_of[p.name],
            output_tokens=pool_tokens.get(p.name, 0),
            cost_per_million_output_tokens=per_million(cost_of[p.name], pool_tokens.get(p.name, 0)),
        )
        for p in pools
    ]


def tenant_usage(window: Window, tenant_ids: Iterable[int] | None = None) -> list[TenantUsage]:
    """Each tenant's requests, tokens and spend over `window`, and its daily budget used today (UTC)."""
    tenants = Tenant.objects.order_by("name")
    if tenant_ids is not None:
        tenants = tenants.filter(pk__in=list(tenant_ids))
    tenant_list = list(tenants)
    ids = [t.pk for t in tenant_list]
    per_token = {p.pool: p.cost / p.output_tokens for p in pool_costs(window) if p.output_tokens > 0}
    rows = RequestLog.objects.filter(
        tenant_id__in=ids, created_at__gte=window.start, created_at__lt=window.end
    )
    totals = {
        t: (n, int(prompt or 0), refused, int(refused_prompt or 0), failed)
        for t, n, prompt, refused, refused_prompt, failed in rows.values("tenant_id")
        .annotate(
            n=Count("id", filter=ADMITTED),
            prompt=Sum("prompt_tokens", filter=ADMITTED),
            refused=Count("id", filter=REFUSED),
            refused_prompt=Sum("prompt_tokens", filter=REFUSED),
            failed=Count("id", filter=FAILED),
        )
        .values_list("tenant_id", "n", "prompt", "refused", "refused_prompt", "failed")
    }
    by_pool: dict[int, dict[str, int]] = defaultdict(dict)
    for tenant_id, pool_name, out in (
        rows.filter(ADMITTED)
        .values("tenant_id", "route_pool")
        .annotate(out=Sum("completion_tokens"))
        .values_list("tenant_id", "route_pool", "out")
    ):
        if tenant_id is not None:
            by_pool[tenant_id][pool_name] = int(out or 0)
    budgets = dict(
        Quota.objects.filter(tenant_id__in=ids, daily_token_budget__isnull=False).values_list(
            "tenant_id", "daily_token_budget"
        )
    )
    used = _daily_tokens_used(ids)
    out = []
    for tenant in tenant_list:
        pools = by_pool.get(tenant.pk, {})
        spends = [
            PoolSpend(pool=name, output_tokens=tokens, spend=tokens * per_token.get(name, 0.0))
            for name, tokens in sorted(pools.items())
            if name in per_token
        ]
        budget = budgets.get(tenant.pk)
        requests, prompt, refused, refused_prompt, failed = totals.get(tenant.pk, (0, 0, 0, 0, 0))
        out.append(
            TenantUsage(
                tenant_id=tenant.pk,
                tenant=tenant.name,
                requests=requests,
                prompt_tokens=prompt,
                output_tokens=sum(pools.values()),
                refused_requests=refused,
                refused_prompt_tokens=refused_prompt,
                failed_requests=failed,
                spend=sum(s.spend for s in spends),
                unpriced_output_tokens=sum(t for name, t in pools.items() if name not in per_token),
                by_pool=spends,
                daily_token_budget=budget,
                daily_tokens_used=used.get(tenant.pk, 0),
                daily_budget_used_ratio=used.get(tenant.pk, 0) / budget if budget else None,
            )
        )
    return out


def _daily_tokens_used(tenant_ids: list[int]) -> dict[int, int]:
    """Tokens each tenant used (or holds reserved) today, UTC: the proxy's budget counters in Redis."""
    if not tenant_ids:
        return {}
    day = timezone.now().astimezone(dt.UTC).strftime("%Y%m%d")
    try:
        raws = get_redis().mget([budget_key(tenant_scope(t), day) for t in tenant_ids])
    except Exception:  # Redis down: today's usage is unknown, shown as 0 rather than failing the page
        return {}
    out = {}
    for tenant_id, raw in zip(tenant_ids, raws, strict=True):
        try:
            out[tenant_id] = int(float(raw)) if raw else 0
        except (TypeError, ValueError):
            out[tenant_id] = 0
    return out
