from __future__ import annotations

from django.urls import path
from rest_framework.routers import DefaultRouter

from alerts.api import views

router = DefaultRouter()
router.register("alerts", views.AlertViewSet, basename="alert")
router.register("alert-events", views.AlertEventViewSet, basename="alertevent")
router.register("alert-rules", views.AlertRuleViewSet, basename="alertrule")

urlpatterns = [
    path("alert-catalogue/", views.rule_catalogue, name="alert-catalogue"),
    path("fleet/health/", views.fleet_health, name="fleet-health"),
    *router.urls,
]
