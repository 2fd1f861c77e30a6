"""The rule editor's API: fleet rows at the Prometheus file's defaults, overrides per deployment or pool,
bad input refused with JSON field errors and nothing saved, every edit audited; acknowledge (who, when)
for admins only, audited; the badge's summary."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from alerts.choices import AlertState, EventKind, Metric
from alerts.models import Alert, AlertRule
from alerts.services import evaluate
from core.models import AuditEvent
from nodes.choices import DeploymentState
from nodes.models import Host
from routing.models import RoutePool
from tests.alerts.conftest import T0, heartbeat

pytestmark = pytest.mark.django_db


def fleet_rule(client: APIClient, metric: str) -> dict[str, Any]:
    rows = client.get("/api/alert-rules/", {"metric": metric, "limit": "100"}).json()["results"]
    (row,) = [r for r in rows if r["scope"] == "fleet"]
    return row


def test_fleet_rules_start_at_the_rules_file_defaults(admin_client: APIClient) -> None:
    body = admin_client.get("/api/alert-rules/", {"limit": 100}).json()
    by_metric = {r["metric"]: r for r in body["results"]}
    assert len(by_metric) == len(Metric.values) == body["count"]
    assert (by_metric["engine_down"]["threshold"], by_metric["engine_down"]["for_seconds"]) == (None, 120)
    assert (by_metric["gpu_memory_high"]["threshold"], by_metric["gpu_memory_high"]["for_seconds"]) == (
        0.97,
        300,
    )
    assert by_metric["high_5xx_ratio"]["alert"] == "InferchainHigh5xxRatio"
    catalogue = admin_client.get("/api/alert-catalogue/").json()
    assert [c["metric"] for c in catalogue] == list(Metric.values)


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"threshold": -1}, "threshold", "Must be 0 or more."),
        ({"threshold": 1.5}, "threshold", "Must be at most 1"),
        ({"threshold": None}, "threshold", "needs a threshold"),
        ({"for_seconds": -5}, "for_seconds", "greater than or equal to 0"),
        ({"for_seconds": "5 minutes"}, "for_seconds", "valid integer"),
        ({"for_seconds": 10**9}, "for_seconds", "less than or equal to"),
        ({"metric": "gpu_fan_speed"}, "metric", "not a valid choice"),
        ({"colour": "red"}, "colour", "Unknown or read-only field."),
    ],
)
def test_bad_edits_are_refused_with_field_errors_and_change_nothing(
    admin_client: APIClient, body: dict[str, Any], field: str, message: str
) -> None:
    rule = fleet_rule(admin_client, "kv_cache_saturated")
    audits = AuditEvent.objects.count()
    response = admin_client.patch(f"/api/alert-rules/{rule['id']}/", body, format="json")
    assert response.status_code == 400, response.content
    errors = response.json()
    assert list(errors) == [field] and message in " ".join(errors[field]), errors
    saved = AlertRule.objects.get(pk=rule["id"])
    assert (saved.threshold, saved.for_seconds, saved.metric) == (0.95, 300, "kv_cache_saturated")
    assert AuditEvent.objects.count() == audits


def test_an_edit_is_saved_and_audited(admin_client: APIClient, admin_user: Any) -> None:
    rule = fleet_rule(admin_client, "gpu_temperature_high")
    response = admin_client.patch(
        f"/api/alert-rules/{rule['id']}/",
        {"threshold": 80, "for_seconds": 60, "enabled": False},
        format="json",
    )
    assert response.status_code == 200, response.content
    assert (response.json()["threshold"], response.json()["for_seconds"]) == (80.0, 60)
    event = AuditEvent.objects.get(object_type="alerts.alertrule", action="update")
    assert event.actor_name == admin_user.username
    before, after = event.before or {}, event.after or {}
    assert (before["threshold"], before["for_seconds"], before["enabled"]) == (85.0, 300, True)
    assert (after["threshold"], after["for_seconds"], after["enabled"]) == (80.0, 60, False)


def test_overrides_per_deployment_and_pool(admin_client: APIClient, make_engine: Any) -> None:
    engine = make_engine()
    pool = RoutePool.objects.create(name="fast", alias="llama-3.1-8b")
    ok = admin_client.post(
        "/api/alert-rules/",
        {"metric": "kv_cache_saturated", "deployment": engine.pk, "threshold": 0.8, "for_seconds": 0},
        format="json",
    )
    assert ok.status_code == 201, ok.content
    assert ok.json()["scope"] == "deployment" and ok.json()["deployment_name"] == engine.name
    assert AuditEvent.objects.filter(object_type="alerts.alertrule", action="create").count() == 1
    # Without a threshold an override starts at the rule's default.
    default = admin_client.post(
        "/api/alert-rules/", {"metric": "queue_growing", "pool": pool.pk, "for_seconds": 60}
    )
    assert default.status_code == 201 and default.json()["threshold"] == 10.0

    refusals = [
        (
            {"metric": "kv_cache_saturated", "deployment": engine.pk, "threshold": 0.7, "for_seconds": 0},
            "deployment",
        ),
        (
            {"metric": "gpu_temperature_high", "deployment": engine.pk, "threshold": 70, "for_seconds": 0},
            "deployment",
        ),
        (
            {"metric": "high_5xx_ratio", "deployment": engine.pk, "threshold": 0.1, "for_seconds": 0},
            "deployment",
        ),
        ({"metric": "engine_down", "pool": pool.pk, "threshold": 3, "for_seconds": 0}, "threshold"),
        ({"metric": "engine_down", "for_seconds": 0}, "non_field_errors"),
        ({"metric": "engine_down", "deployment": engine.pk, "pool": pool.pk, "for_seconds": 0}, "pool"),
        ({"metric": "engine_down", "deployment": 999_999, "for_seconds": 0}, "deployment"),
    ]
    for body, field in refusals:
        response = admin_client.post("/api/alert-rules/", body, format="json")
        assert response.status_code == 400 and field in response.json(), (body, response.json())
    assert AlertRule.objects.exclude(deployment=None, pool=None).count() == 2

    # A fleet row cannot go; an override can, audited.
    fleet = fleet_rule(admin_client, "engine_down")
    assert admin_client.delete(f"/api/alert-rules/{fleet['id']}/").status_code == 409
    assert admin_client.delete(f"/api/alert-rules/{ok.json()['id']}/").status_code == 204
    assert AuditEvent.objects.filter(object_type="alerts.alertrule", action="delete").count() == 1
    # The scope of a saved rule is fixed.
    changed = admin_client.patch(
        f"/api/alert-rules/{default.json()['id']}/", {"metric": "kv_cache_saturated"}
    )
    assert changed.status_code == 400 and "metric" in changed.json()


def test_only_admins_edit_or_acknowledge(viewer_client: APIClient, evaluator_client: APIClient) -> None:
    rule = fleet_rule(viewer_client, "host_down")
    for client in (viewer_client, evaluator_client):
        assert client.patch(f"/api/alert-rules/{rule['id']}/", {"for_seconds": 5}).status_code == 403


def test_acknowledge_keeps_who_and_when(
    admin_client: APIClient,
    admin_user: Any,
    viewer_client: APIClient,
    alert_host: Host,
    make_engine: Any,
    redis_clean: None,
) -> None:
    make_engine(state=DeploymentState.CRASHED)
    evaluate(now=T0)
    pending = Alert.objects.get(metric=Metric.ENGINE_DOWN)
    assert admin_client.post(f"/api/alerts/{pending.pk}/acknowledge/").status_code == 409
    heartbeat(alert_host, T0 + 121)
    evaluate(now=T0 + 121)
    summary = viewer_client.get("/api/alerts/summary/").json()
    assert summary["firing"] == 1 and summary["unacknowledged"] == 1

    assert viewer_client.post(f"/api/alerts/{pending.pk}/acknowledge/").status_code == 403
    response = admin_client.post(f"/api/alerts/{pending.pk}/acknowledge/")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["acknowledged_by_name"] == admin_user.username and body["acknowledged_at"]
    # In the order they happened (evaluations ran on a fabricated clock, the acknowledgement on the real one).
    events = sorted(body["events"], key=lambda e: e["id"])
    assert [e["kind"] for e in events] == [EventKind.PENDING, EventKind.FIRING, EventKind.ACKNOWLEDGED]
    assert events[-1]["actor_name"] == admin_user.username
    assert AuditEvent.objects.filter(object_type="alerts.alert", actor_name=admin_user.username).count() == 1
    # Twice: refused, the first acknowledgement stays.
    again = admin_client.post(f"/api/alerts/{pending.pk}/acknowledge/")
    assert again.status_code == 409 and "Already acknowledged by alice-admin" in again.json()["detail"]
    assert viewer_client.get("/api/alerts/summary/").json()["unacknowledged"] == 0
    firing = viewer_client.get("/api/alerts/", {"state": AlertState.FIRING}).json()
    assert firing["count"] == 1 and firing["results"][0]["alert"] == "InferchainEngineDown"
    history = viewer_client.get("/api/alert-events/", {"alert": pending.pk}).json()
    assert history["count"] == 3
