"""What the rules read of the fleet: the rows and live records of the exposition's read
(`routing.fleet_metrics.read_state`), with only the columns the rules use.

The rules mirror deploy/prometheus/inferchain-rules.yml, which Prometheus evaluates on the exposition, so
they must see the fleet it shows: the same hosts, up by the same heartbeat bound; the same GPUs; the same
deployments (all but those stopped and meant to stay stopped); the same live records, in one MGET
(expired ones absent, all absent with Redis down); the same tenants' budgets and tokens of the day.
tests/alerts/test_fleet_read.py compares the two reads.

What it leaves out: what only the exposition's labels need (a GPU's uuid, name and kind; a deployment's
engine, model and revision), what a rule switched off fleet-wide would read (the GPUs with both GPU rules
off, the tenants with the budget rule off; those rules take no narrower row), and every join: GPUs and
deployments name their host by id, from the hosts read first, and come in id order rather than sorted by
name (the deployments' query took twice as long). A host's up is compared in the query rather than
after parsing its heartbeat in Python (~5 us a timestamp through Django's time-zone loader).
At 1,000 hosts x 8 GPUs and 5,000 engines it takes two thirds of read_state's time (60-91 against
88-131 ms median, the two alternating in one process on a loaded 2-core VM); most of what is left is the
MGET of 13,000 records and their parse.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, NamedTuple

from django.conf import settings
from django.db.models import Q

from console.models import Quota
from nodes.choices import DeploymentState, DesiredState
from nodes.models import Deployment, Gpu, Host
from routing.fleet_metrics import live_int, live_json, read_live_values


class DeploymentInfo(NamedTuple):
    """What the rules use of one deployment (and what a pool's or deployment's override matches)."""

    pk: int
    name: str
    alias: str  # served_model_name
    state: str
    desired_state: str
    restarts_total: int
    host: str
    role: str
    version_id: int


@dataclass
class RuleFleet:
    hosts: list[tuple[str, bool]]  # (name, up), by name
    # (host, index, live record) of the GPUs with a live record, by host id and index
    gpus: list[tuple[str, int, dict[str, Any]]]
    deployments: list[tuple[DeploymentInfo, dict[str, Any] | None]]  # by id
    tenants: list[tuple[str, int, int]]  # (name, daily budget, tokens used today), by name


# DeploymentInfo's fields as columns, the host by id.
_DEPLOYMENT_COLUMNS = (
    "pk",
    "name",
    "served_model_name",
    "state",
    "desired_state",
    "restarts_total",
    "host_id",
    "role",
    "model_version_id",
)


def read_fleet(now: float, *, gpus: bool = True, tenants: bool = True) -> RuleFleet:
    """The fleet at `now` as the rules see it; `gpus` and `tenants` False leave those out (empty)."""
    cutoff = dt.datetime.fromtimestamp(now - settings.NODE_UNREACHABLE_SECONDS, dt.UTC)
    # `up` is NULL for a host that never sent a heartbeat: down, as in read_state.
    host_rows = list(
        Host.objects.order_by("name")
        .annotate(up=Q(last_heartbeat__gte=cutoff))
        .values_list("pk", "name", "up")
    )
    # GPUs and deployments name their host by id, from the hosts read just now: no join, and the
    # deployments in id order rather than sorted by name (their query took half the time).
    host_name = {pk: name for pk, name, _ in host_rows}
    gpu_rows = (
        [
            (host_name[host_id], index)
            for host_id, index in Gpu.objects.order_by("host_id", "index").values_list("host_id", "index")
            if host_id in host_name  # a host added since: read next run
        ]
        if gpus
        else []
    )
    listed = Deployment.objects.exclude(state=DeploymentState.STOPPED, desired_state=DesiredState.STOPPED)
    deployments = [
        DeploymentInfo(pk, name, alias, state, desired, restarts, host_name[host_id], role, version)
        for pk, name, alias, state, desired, restarts, host_id, role, version in listed.order_by(
            "pk"
        ).values_list(*_DEPLOYMENT_COLUMNS)
        if host_id in host_name
    ]
    budgets: list[tuple[int, str, int | None]] = (
        list(
            Quota.objects.filter(tenant__isnull=False, daily_token_budget__isnull=False)
            .order_by("tenant__name")
            .values_list("tenant_id", "tenant__name", "daily_token_budget")
        )
        if tenants
        else []
    )
    # Redis down: every live value is absent (the evaluator has stopped before this, at its lock).
    raws = read_live_values(gpu_rows, [d.pk for d in deployments], [tid for tid, _, _ in budgets], now)
    n_gpus, n_deps = len(gpu_rows), len(deployments)
    gpu_lives = [
        (h, i, live)
        for (h, i), raw in zip(gpu_rows, raws, strict=False)
        if (live := live_json(raw)) is not None
    ]
    return RuleFleet(
        hosts=[(name, bool(up)) for _, name, up in host_rows],
        gpus=gpu_lives,
        deployments=list(zip(deployments, map(live_json, raws[n_gpus : n_gpus + n_deps]), strict=True)),
        tenants=[
            (name, int(budget or 0), live_int(raws[n_gpus + n_deps + k]))
            for k, (_tid, name, budget) in enumerate(budgets)
        ],
    )
