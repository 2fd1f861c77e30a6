from __future__ import annotations

from django.urls import path
from rest_framework.routers import DefaultRouter

from nodes.api import agent_views, views

router = DefaultRouter()
router.register("hosts", views.HostViewSet, basename="host")
router.register("deployments", views.DeploymentViewSet, basename="deployment")
router.register("baselines", views.PerformanceBaselineViewSet, basename="baseline")

urlpatterns = [
    path("agent/sync/", agent_views.agent_sync, name="agent-sync"),
    path("agent/logs/", agent_views.agent_logs, name="agent-logs"),
    path("telemetry/history/", views.telemetry_history, name="telemetry-history"),
    path("fleet/summary/", views.fleet_summary_view, name="fleet-summary"),
    *router.urls,
]
