"""The routing snapshot prices each engine: its host's cost per hour times the share of the host's GPUs
it holds (the slo_cost scorer's cost per output token starts from it)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from routing.proxy.config import load_routing_snapshot
from tests.routing.history_helpers import make_fleet

pytestmark = pytest.mark.django_db


def test_an_engine_costs_its_share_of_the_host() -> None:
    fleet = make_fleet(gpus=4)  # the deployment holds GPU 0 of 4
    fleet.host.cost_per_hour = Decimal("10")
    fleet.host.save(update_fields=["cost_per_hour"])
    ep = load_routing_snapshot().endpoints[str(fleet.deployment.pk)]
    assert ep.cost_per_hour == pytest.approx(2.5)
    fleet.deployment.gpu_indices = [0, 1, 2, 3]
    fleet.deployment.save(update_fields=["gpu_indices"])
    assert load_routing_snapshot().endpoints[str(fleet.deployment.pk)].cost_per_hour == pytest.approx(10.0)
