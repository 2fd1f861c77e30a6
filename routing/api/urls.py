from __future__ import annotations

from django.urls import path
from rest_framework.routers import DefaultRouter

from routing.api import views

router = DefaultRouter()
router.register("route-pools", views.RoutePoolViewSet, basename="routepool")
router.register("route-policies", views.RoutePolicyViewSet, basename="routepolicy")
router.register("request-log", views.RequestLogViewSet, basename="requestlog")

urlpatterns = [
    path("routing/usage/", views.usage, name="routing-usage"),
    path("routing/traffic/", views.traffic, name="routing-traffic"),
    *router.urls,
]
