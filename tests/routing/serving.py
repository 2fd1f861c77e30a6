"""Builders for "what serves an alias" tests: the demo's shape (an fp16 active version on a long-context
engine, an AWQ version on two fast engines in a pool that names it, a policy by prompt length) and
request-log rows with a known split."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.utils import timezone

from models_registry.models import ModelAlias, ModelVersion
from nodes.models import Deployment
from routing.demo import DEMO_SPILL
from routing.models import RequestLog, RoutePolicy, RoutePool
from tests.routing.fleet import ensure_alias
from tests.routing.rollouts import log_requests, new_version, ready_deployment

# The live split written by `log_split`: 36 requests to fp16, 64 to AWQ in the window.
FP16_REQUESTS = 36
AWQ_REQUESTS = 64


@dataclass
class TwoVersions:
    alias: ModelAlias
    fp16: ModelVersion  # the active version: one long-context engine
    awq: ModelVersion  # pinned by the fast pool: two engines
    long: Deployment
    fast: list[Deployment]


def two_version_alias(name: str = "llama-serving") -> TwoVersions:
    """The demo's routing for `name`: 3 ready engines, 2 of them the AWQ version (routing.demo)."""
    alias = ensure_alias(name)
    fp16 = alias.active_version
    awq = ModelVersion.objects.filter(model=fp16.model, revision="awq").first() or new_version(alias, "awq")
    long = ready_deployment(alias, fp16)
    fast = [ready_deployment(alias, awq), ready_deployment(alias, awq)]
    Deployment.objects.filter(pk=long.pk).update(role="long-context")
    Deployment.objects.filter(pk__in=[d.pk for d in fast]).update(role="high-throughput")
    fast_pool = RoutePool.objects.create(
        name=f"{name}-fast", alias=name, role="high-throughput", model_version=awq
    )
    long_pool = RoutePool.objects.create(name=f"{name}-long", alias=name, role="long-context")
    RoutePolicy.objects.create(
        name=f"{name} by prompt length",
        alias=name,
        rules=[
            {"match": {"task": ["summarize"]}, "pool": long_pool.name},
            {
                "match": {"max_prompt_tokens": 6000},
                "pool": fast_pool.name,
                "spill": {"pool": long_pool.name, **DEMO_SPILL},
            },
        ],
        default_pool=long_pool,
        fallback_pool=long_pool,
    )
    return TwoVersions(alias, fp16, awq, long, fast)


def log_split(tv: TwoVersions, at: dt.datetime | None = None) -> None:
    """The recent split (36 % fp16, 64 % AWQ) plus rows that must not count: older than the window,
    refused before any engine (no version), another alias's."""
    now = at or timezone.now()
    recent = now - dt.timedelta(minutes=2)
    log_requests(tv.alias, tv.fp16, FP16_REQUESTS, at=recent)
    log_requests(tv.alias, tv.awq, AWQ_REQUESTS, at=recent)
    # An hour ago everything went to fp16: outside the 15-minute window.
    log_requests(tv.alias, tv.fp16, 300, at=now - dt.timedelta(hours=1))
    RequestLog.objects.bulk_create(
        RequestLog(created_at=recent, alias=tv.alias.name, status=429, error_type="rate_limited")
        for _ in range(50)
    )
    other = ensure_alias(f"{tv.alias.name}-other")
    log_requests(other, tv.fp16, 40, at=recent)
