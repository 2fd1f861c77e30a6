"""Performance baselines: a bench report saved on a deployment, and the live engine compared against it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from bench.runner import Level, Plan, Report
from bench.stats import RequestResult, Slo, summarize
from core.models import AuditEvent
from core.redis_client import get_redis
from nodes import baselines
from nodes.lifecycle import live_deployment_key
from nodes.models import Deployment, PerformanceBaseline

pytestmark = pytest.mark.django_db


def bench_report(ttft_by_clients: dict[int, float]) -> dict[str, Any]:
    """A report as `inferchain bench` writes it, with every request of a level at the given TTFT."""
    plan = Plan(target="http://proxy:8000", key=None, model="llama-8b", items=[], levels=[], slo=Slo())
    report = Report(plan=plan, model="llama-8b")
    for clients, ttft in ttft_by_clients.items():
        results = [
            RequestResult(start=0.0, end=ttft + 0.5, ok=True, first_token=ttft,
                          token_times=[ttft, ttft + 0.5], output_tokens=2)
            for _ in range(10)
        ]  # fmt: skip
        report.levels.append({**Level(clients=clients).as_dict(), **summarize(results, 10.0, plan.slo)})
    return report.as_dict()


def test_the_report_the_tool_writes_becomes_a_baseline() -> None:
    fields = baselines.parse_report(bench_report({10: 0.2, 1: 0.1, 20: 0.4}))
    assert fields["mode"] == "closed" and fields["model"] == "llama-8b"
    assert [lv["clients"] for lv in fields["levels"]] == [1, 10, 20]  # sorted by load
    assert [lv["ttft_p95_s"] for lv in fields["levels"]] == pytest.approx([0.1, 0.2, 0.4])
    assert fields["levels"][0]["requests_per_s"] == pytest.approx(1.0)


def test_expected_ttft_is_interpolated_between_levels_and_held_flat_beyond() -> None:
    levels = baselines.parse_report(bench_report({1: 0.1, 10: 0.2, 20: 0.4}))["levels"]
    assert baselines.expected_at(levels, 5.5, "ttft_p95_s") == pytest.approx(0.15)  # halfway from 1 to 10
    assert baselines.expected_at(levels, 15, "ttft_p95_s") == pytest.approx(0.3)
    assert baselines.expected_at(levels, 0.5, "ttft_p95_s") == pytest.approx(0.1)
    assert baselines.expected_at(levels, 80, "ttft_p95_s") == pytest.approx(0.4)


@pytest.mark.parametrize(
    ("report", "reason"),
    [
        ({"levels": []}, "no load levels"),
        ([1, 2], "Expected the JSON object"),
        ({"levels": [{"clients": 1}]}, "levels[0].requests_per_s must be a number"),
        ({"levels": [{"rate": 1.0, "clients": 2}]}, "levels[0] must have either 'clients' or 'rate'"),
    ],
)
def test_a_report_that_is_not_a_bench_run_is_refused(
    admin_client: APIClient, make_deployment: Callable[..., Deployment], report: Any, reason: str
) -> None:
    d = make_deployment()
    resp = admin_client.post(
        "/api/baselines/", {"deployment": d.pk, "name": "x", "report": report}, format="json"
    )
    assert resp.status_code == 400
    assert reason in " ".join(resp.json()["report"])
    assert not PerformanceBaseline.objects.exists()


def test_admin_saves_a_baseline_viewer_cannot(
    admin_client: APIClient, viewer_client: APIClient, make_deployment: Callable[..., Deployment]
) -> None:
    d = make_deployment()
    body = {"deployment": d.pk, "name": "before the upgrade", "report": bench_report({1: 0.1, 10: 0.2})}
    assert viewer_client.post("/api/baselines/", body, format="json").status_code == 403
    resp = admin_client.post("/api/baselines/", body, format="json")
    assert resp.status_code == 201, resp.json()
    saved = resp.json()
    assert saved["created_by"] == "alice-admin" and saved["mode"] == "closed"
    assert [lv["clients"] for lv in saved["levels"]] == [1, 10]
    assert "report" not in saved
    listed = viewer_client.get("/api/baselines/", {"deployment": d.pk}).json()
    assert [b["id"] for b in listed["results"]] == [saved["id"]]
    assert AuditEvent.objects.filter(object_id=str(saved["id"]), action="create").exists()


def test_live_ttft_twice_the_baseline_at_the_same_load_is_called_out(
    admin_client: APIClient, make_deployment: Callable[..., Deployment], redis_clean: None
) -> None:
    d = make_deployment()
    check_url = f"/api/deployments/{d.pk}/baseline-check/"
    assert admin_client.get(check_url).json()["status"] == "unknown"
    body = {"deployment": d.pk, "name": "week 1", "report": bench_report({1: 0.1, 10: 0.2, 20: 0.4})}
    assert admin_client.post("/api/baselines/", body, format="json").status_code == 201
    live = {"num_requests_running": 12.0, "num_requests_waiting": 3.0, "ttft_p95_s": 0.75}
    get_redis().set(live_deployment_key(d.pk), json.dumps(live))
    check = admin_client.get(check_url).json()
    assert check["load"] == 15.0
    assert check["expected_ttft_p95_s"] == pytest.approx(0.3)
    assert check["ratio"] == pytest.approx(2.5)
    assert check["status"] == "outside"
    assert "2.5x the baseline at 15 requests in flight" in check["message"]
    get_redis().set(live_deployment_key(d.pk), json.dumps({**live, "ttft_p95_s": 0.35}))
    assert admin_client.get(check_url).json()["status"] == "within"
