"""A pool with a scaling policy and fabricated live state, for the scaler's tests."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from core.redis_client import get_redis
from nodes.choices import DeploymentState, DesiredState
from nodes.lifecycle import live_deployment_key
from nodes.models import Deployment
from routing.models import RoutePool
from routing.scaling.models import ScalingPolicy

ROLE = "high-throughput"
# Evaluation times are given to the scaler explicitly; they start at a whole interval.
BASE = timezone.now().replace(microsecond=0, second=0)


def make_policy(template: Deployment, **fields: Any) -> ScalingPolicy:
    pool = RoutePool.objects.create(name="fast", alias=template.served_model_name, role=ROLE)
    values: dict[str, Any] = {
        "pool": pool,
        "template": template,
        "min_engines": 1,
        "max_engines": 4,
        "target_waiting_per_engine": 2.0,
        "target_kv_usage": 0.8,
        "scale_up_cooldown_s": 30,
        "scale_down_cooldown_s": 120,
        "evaluation_interval_s": 10,
    }
    values.update(fields)
    return ScalingPolicy.objects.create(**values)


def set_live(
    deployment: Deployment,
    *,
    waiting: float = 0,
    running: float = 0,
    kv: float = 0.0,
    has_metrics: bool = True,
) -> None:
    """What the agent would publish for this engine (nodes/agent/supervisor.py engine_live)."""
    live = {
        "has_metrics": has_metrics,
        "deployment_id": deployment.pk,
        "state": "ready",
        "num_requests_waiting": waiting,
        "num_requests_running": running,
        "kv_cache_usage_perc": kv,
        "ttft_p95_s": None,
    }
    get_redis().set(live_deployment_key(deployment.pk), json.dumps(live), ex=600)


def wanted_running(policy: ScalingPolicy) -> list[Deployment]:
    return list(
        Deployment.objects.filter(
            served_model_name=policy.template.served_model_name, desired_state=DesiredState.RUNNING, role=ROLE
        ).order_by("pk")
    )


def settle(policy: ScalingPolicy) -> None:
    """What the agents would do next: pending engines become ready, draining ones stop."""
    for dep in wanted_running(policy):
        if dep.state != DeploymentState.READY:
            Deployment.objects.filter(pk=dep.pk).update(state=DeploymentState.READY)
    Deployment.objects.filter(desired_state=DesiredState.STOPPED, state=DeploymentState.STOPPING).update(
        state=DeploymentState.STOPPED, pid=None
    )


def at(seconds: float) -> datetime:
    return BASE + timedelta(seconds=seconds)
