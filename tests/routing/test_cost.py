"""Cost per output token, pool costs and tenants' spend on the hand-worked case of cost_scenario.py."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from routing import cost
from tests.routing.cost_scenario import build

pytestmark = pytest.mark.django_db


def test_active_hours_follows_the_state_history() -> None:
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    h = dt.timedelta(hours=1)
    window = cost.Window(t0 + 2 * h, t0 + 10 * h)
    events = [
        (t0 + h, "pending", "ready"),
        (t0 + 4 * h, "ready", "failed"),
        (t0 + 6 * h, "failed", "starting"),
    ]
    # pending from creation, ready, failed (inactive) for 2 h, then starting to the window's end.
    assert cost.active_hours(t0, "starting", events, window) == 2 + 4
    assert cost.active_hours(t0, "ready", [], window) == 8  # no history: its state now, since creation
    assert cost.active_hours(t0, "stopped", [], window) == 0
    assert cost.active_hours(t0 + 12 * h, "ready", [], window) == 0  # created after the window
    # Two changes at one instant keep their order (a restart: stopping -> stopped -> starting), not
    # their names' ("stopped" sorts before "stopping"): it ends starting, active to the window's end.
    same = [(t0 + h, "stopping", "stopped"), (t0 + h, "stopped", "starting")]
    assert cost.active_hours(t0, "starting", same, window) == 8
    # Stopped after the window ended: the later event says it was ready all through the window.
    assert cost.active_hours(t0, "stopped", [(t0 + 11 * h, "ready", "stopped")], window) == 8


def test_costs_on_a_hand_checked_case(redis_clean: None) -> None:
    end = timezone.now().replace(microsecond=0)
    build(end)
    window = cost.Window(end - dt.timedelta(hours=6), end)

    deployments = {c.deployment: c for c in cost.deployment_costs(window)}
    assert set(deployments) == {"chat-a", "chat-b", "spare-e", "cpu-d"}  # idle-c failed before the window
    figures = {
        name: (c.running_hours, c.cost, c.output_tokens, c.cost_per_million_output_tokens)
        for name, c in deployments.items()
    }
    assert figures == {
        "chat-a": (5.0, 20.0, 2_000_000, 10.0),
        "chat-b": (3.0, 6.0, 500_000, 12.0),
        "spare-e": (2.0, 4.0, 0, None),
        "cpu-d": (4.0, 4.0, 200_000, 20.0),
    }
    assert (deployments["chat-a"].gpus_held, deployments["chat-a"].host_gpus) == (2, 4)

    pools = {p.pool: p for p in cost.pool_costs(window)}
    assert {
        name: (p.cost, p.output_tokens, p.cost_per_million_output_tokens) for name, p in pools.items()
    } == {
        "chat-fast": (25.0, 2_000_000, 12.5),
        "chat-long": (5.0, 500_000, 10.0),
        "small": (4.0, 200_000, 20.0),
    }
    assert pools["chat-fast"].deployments == ["chat-a", "chat-b", "spare-e"]
    assert [p.pool for p in pools.values() if p.implicit] == ["small"]

    tenants = {t.tenant: t for t in cost.tenant_usage(window)}
    acme, globex = tenants["acme"], tenants["globex"]
    assert (acme.requests, acme.prompt_tokens, acme.output_tokens) == (8, 800, 2_000_000)
    assert acme.spend == pytest.approx(23.75)
    assert [(s.pool, s.output_tokens, s.spend) for s in acme.by_pool] == [
        ("chat-fast", 1_500_000, pytest.approx(18.75)),
        ("chat-long", 500_000, pytest.approx(5.0)),
    ]
    assert (acme.daily_token_budget, acme.daily_tokens_used, acme.daily_budget_used_ratio) == (
        4_000_000,
        1_000_000,
        0.25,
    )
    assert globex.spend == pytest.approx(10.25) and globex.unpriced_output_tokens == 100_000
    assert globex.daily_token_budget is None and globex.daily_budget_used_ratio is None
    # Every dollar of the fleet's cost lands on a tenant.
    assert acme.spend + globex.spend == pytest.approx(sum(c.cost for c in deployments.values()))


def test_cost_api(admin_client: APIClient, redis_clean: None) -> None:
    scenario = build(timezone.now().replace(microsecond=0))
    since = (scenario.end - dt.timedelta(hours=6)).isoformat()
    until = scenario.end.isoformat()
    window: dict[str, Any] = {"since": since, "until": until}

    body = admin_client.get("/api/routing/cost/pools/", window).json()
    assert body["window"]["hours"] == 6.0
    assert {p["pool"]: p["cost_per_million_output_tokens"] for p in body["results"]} == {
        "chat-fast": 12.5,
        "chat-long": 10.0,
        "small": 20.0,
    }
    chat_a = scenario.deployments["chat-a"]
    body = admin_client.get("/api/routing/cost/deployments/", {**window, "deployment_id": chat_a.pk}).json()
    assert [(d["deployment"], d["cost"], d["cost_per_million_output_tokens"]) for d in body["results"]] == [
        ("chat-a", 20.0, 10.0)
    ]
    acme = scenario.tenants["acme"]
    body = admin_client.get("/api/routing/cost/tenants/", {**window, "tenant_id": acme.pk}).json()
    [usage] = body["results"]
    assert (usage["tenant"], usage["spend"], usage["daily_budget_used_ratio"]) == ("acme", 23.75, 0.25)
    # The default window is the last 24 hours; one reaching into the future ends now.
    body = admin_client.get("/api/routing/cost/pools/").json()
    assert round(body["window"]["hours"]) == 24
    ahead = (timezone.now() + dt.timedelta(hours=5)).isoformat()
    body = admin_client.get("/api/routing/cost/deployments/", {"since": since, "until": ahead}).json()
    assert round(body["window"]["hours"]) == 6
    assert {d["deployment"]: d["cost"] for d in body["results"]}["chat-a"] == 20.0


@pytest.mark.parametrize(
    ("params", "field", "message"),
    [
        ({"hours": "0"}, "hours", "greater than or equal to 1"),
        ({"hours": "x"}, "hours", "valid integer"),
        ({"hours": "800"}, "hours", "less than or equal to 744"),
        ({"since": "yesterday"}, "since", "Datetime has wrong format"),
        ({"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "since", "before until"),
        ({"since": "2026-01-01T00:00:00Z", "until": "2026-03-01T00:00:00Z"}, "since", "at most 31 days"),
        ({"hours": "2", "since": "2026-01-01T00:00:00Z"}, "hours", "not both"),
        ({"since": "2999-01-01T00:00:00Z", "until": "2999-01-02T00:00:00Z"}, "since", "in the past"),
        ({"tenant_id": "acme"}, "tenant_id", "valid integer"),
    ],
)
def test_bad_windows_get_field_errors(
    admin_client: APIClient, params: dict[str, str], field: str, message: str
) -> None:
    response = admin_client.get("/api/routing/cost/tenants/", params)
    assert response.status_code == 400
    assert message in " ".join(response.json()[field]), response.json()


def test_every_signed_in_role_reads_costs_and_nobody_else(
    viewer_client: APIClient, anon_client: APIClient
) -> None:
    assert viewer_client.get("/api/routing/cost/tenants/").status_code == 200
    assert anon_client.get("/api/routing/cost/tenants/").status_code in (401, 403)
