"""The rules' read of the fleet (alerts/fleet.py) sees what the exposition's read (routing.fleet_metrics
.read_state) sees: the same hosts up and down, GPUs with a live record, deployments listed and their
records, tenants' budgets and tokens, and nothing live with Redis down. The rules mirror the Prometheus
rules file, which runs on the exposition, so the two reads must not drift apart."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from alerts.choices import Metric
from alerts.fleet import RuleFleet, read_fleet
from alerts.models import AlertRule
from alerts.services import ensure_default_rules, evaluate
from console.models import Quota, Tenant
from core.redis_client import get_redis
from models_registry.models import ModelVersion
from nodes.choices import DeploymentState, DesiredState
from nodes.lifecycle import live_deployment_key, live_gpu_key
from nodes.models import Deployment, Gpu, Host
from routing import fleet_metrics
from routing.fleet_metrics import FleetState, read_state
from routing.proxy.limits import budget_key, tenant_scope
from tests.alerts.conftest import T0, at, heartbeat, publish_engine, publish_gpu

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _redis(redis_clean: None) -> None:
    return None


def as_seen_by_rules(state: FleetState) -> dict[str, Any]:
    """read_state's answer, in the shape of read_fleet's (what the rules use of it)."""
    return {
        "hosts": state.hosts,
        "gpus": [
            (host, int(index), live) for (host, index, _uuid), _, _, live in state.gpus if live is not None
        ],
        "deployments": sorted(
            (
                (
                    d.pk,
                    d.name,
                    d.served_model_name,
                    d.state,
                    d.desired_state,
                    d.restarts_total,
                    d.host,
                    d.role,
                    d.model_version_id,
                ),
                live,
            )
            for _labels, d, live in state.deployments
        ),
        "tenants": state.tenants,
    }


def as_read(fleet: RuleFleet) -> dict[str, Any]:
    return {
        "hosts": fleet.hosts,
        "gpus": fleet.gpus,
        "deployments": sorted((tuple(d), live) for d, live in fleet.deployments),
        "tenants": fleet.tenants,
    }


@pytest.fixture
def mixed_fleet(alert_host: Host, make_engine: Any, version: ModelVersion) -> None:
    """Hosts up, late and silent; GPUs with a record, without, with one that is not an object; engines
    ready, crashed, stopped for good, stopped but meant to run, without /metrics; two tenants."""
    bound = settings.NODE_UNREACHABLE_SECONDS
    late = Host.objects.create(name="late-node", address="10.0.0.2", last_heartbeat=at(T0 - bound - 0.001))
    Host.objects.create(name="silent-node", address="10.0.0.3", last_heartbeat=None)
    Host.objects.create(name="edge-node", address="10.0.0.4", last_heartbeat=at(T0 - bound))  # just up
    Gpu.objects.create(host=late, index=0, uuid="GPU-late-0", name="H100")
    Gpu.objects.create(host=late, index=1, uuid="GPU-late-1", name="H100")
    publish_gpu(alert_host, 0, temperature_c=91.0)
    publish_gpu(late, 0, temperature_c=40.0)
    get_redis().set(live_gpu_key(late.name, 1), b"[1, 2]", ex=300)
    ready = make_engine(restarts_total=4)
    publish_engine(ready, kv_cache_usage_perc=0.97, ttft_p95_s=0.3)
    make_engine(state=DeploymentState.CRASHED)
    make_engine(state=DeploymentState.STOPPED, desired_state=DesiredState.STOPPED)
    make_engine(state=DeploymentState.STOPPED, desired_state=DesiredState.RUNNING, host=late)
    llama = make_engine(role="decode")
    get_redis().set(live_deployment_key(llama.pk), b'{"has_metrics": false}', ex=300)
    broken = make_engine()
    get_redis().set(live_deployment_key(broken.pk), b"{not json", ex=300)
    day = at(T0).strftime("%Y%m%d")
    for name, budget, used in (("acme", 1000, 950), ("zeta", 500, None)):
        tenant = Tenant.objects.create(name=name)
        Quota.objects.create(tenant=tenant, daily_token_budget=budget)
        if used is not None:
            get_redis().set(budget_key(tenant_scope(tenant.pk), day), used)


def test_the_rules_read_what_the_exposition_reads(mixed_fleet: None) -> None:
    fleet = read_fleet(T0)
    assert as_read(fleet) == as_seen_by_rules(read_state(T0))
    # The fixture's cases are all there: a check of the comparison itself.
    assert dict(fleet.hosts) == {
        "alert-node": True,
        "edge-node": True,
        "late-node": False,
        "silent-node": False,
    }
    assert [(h, i) for h, i, _ in fleet.gpus] == [("alert-node", 0), ("late-node", 0)]
    assert len(fleet.deployments) == 5 and sum(live is not None for _, live in fleet.deployments) == 2
    assert fleet.tenants == [("acme", 1000, 950), ("zeta", 500, 0)]


def test_with_redis_down_both_reads_see_nothing_live(
    mixed_fleet: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Down:
        def mget(self, keys: Any) -> Any:
            raise ConnectionError("Redis is down")

    # Both reads' one MGET (fleet_metrics.read_live_values).
    monkeypatch.setattr(fleet_metrics, "get_redis", Down)
    fleet = read_fleet(T0)
    assert as_read(fleet) == as_seen_by_rules(read_state(T0))
    assert fleet.gpus == [] and {live for _, live in fleet.deployments} == {None}
    assert fleet.tenants == [("acme", 1000, 0), ("zeta", 500, 0)]


def test_rules_switched_off_fleet_wide_leave_their_subjects_unread(
    mixed_fleet: None, alert_host: Host
) -> None:
    """Both GPU rules off: no GPU is read (nor its record); the budget rule off: no tenant. They take the
    fleet-wide row only, so nothing narrower can switch them back on for one subject."""
    ensure_default_rules()
    AlertRule.objects.filter(
        metric__in=[Metric.GPU_MEMORY_HIGH, Metric.GPU_TEMPERATURE_HIGH, Metric.TENANT_NEAR_BUDGET]
    ).update(enabled=False)
    heartbeat(alert_host, T0)
    with CaptureQueriesContext(connection) as ran:
        result = evaluate(now=T0)
    tables = " ".join(q["sql"] for q in ran.captured_queries)
    assert Gpu._meta.db_table not in tables and Quota._meta.db_table not in tables
    assert result.observed and Deployment._meta.db_table in tables

    # One GPU rule on again: the GPUs are read, and the hot one observed (a re-run at the same time).
    AlertRule.objects.filter(metric=Metric.GPU_TEMPERATURE_HIGH).update(enabled=True)
    assert evaluate(now=T0).observed == result.observed + 1
