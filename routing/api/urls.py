from __future__ import annotations

from django.urls import path
from rest_framework.routers import DefaultRouter

from routing.api import chains, cost, history, predictions, rollouts, serving, shadow_pairs, views
from routing.scaling import api as scaling

router = DefaultRouter()
router.register("route-pools", views.RoutePoolViewSet, basename="routepool")
router.register("route-policies", views.RoutePolicyViewSet, basename="routepolicy")
router.register("stage-chains", chains.StageChainViewSet, basename="stagechain")
router.register("request-log", views.RequestLogViewSet, basename="requestlog")
router.register("rollouts", rollouts.RolloutViewSet, basename="rollout")
router.register("shadow-configs", rollouts.ShadowConfigViewSet, basename="shadowconfig")
router.register("shadow-pairs", shadow_pairs.ShadowPairViewSet, basename="shadowpair")
router.register("scaling-policies", scaling.ScalingPolicyViewSet, basename="scalingpolicy")

urlpatterns = [
    path("routing/usage/", views.usage, name="routing-usage"),
    path("routing/traffic/", views.traffic, name="routing-traffic"),
    path("routing/serving/", serving.serving, name="routing-serving"),
    path("routing/predictions/", predictions.predictions, name="routing-predictions"),
    path("routing/serving/<path:name>/", serving.alias_serving, name="routing-alias-serving"),
    path("routing/cost/deployments/", cost.deployment_costs, name="routing-cost-deployments"),
    path("routing/cost/pools/", cost.pool_costs, name="routing-cost-pools"),
    path("routing/cost/tenants/", cost.tenant_usage, name="routing-cost-tenants"),
    path("history/", history.history, name="history"),
    *router.urls,
]
