from __future__ import annotations

from django.urls import path
from rest_framework.routers import DefaultRouter

from models_registry.api import eval_runs, evaluations, stores, views

router = DefaultRouter()
router.register("models", views.RegistryModelViewSet, basename="model")
router.register("model-versions", views.ModelVersionViewSet, basename="modelversion")
router.register("quantization-configs", views.QuantizationConfigViewSet, basename="quantizationconfig")
router.register("model-aliases", views.ModelAliasViewSet, basename="modelalias")
router.register("model-stores", stores.ModelStoreViewSet, basename="modelstore")
router.register("eval-suites", evaluations.EvalSuiteViewSet, basename="evalsuite")
router.register("eval-suite-versions", evaluations.EvalSuiteVersionViewSet, basename="evalsuiteversion")
router.register("eval-cases", evaluations.EvalCaseViewSet, basename="evalcase")
router.register("eval-runs", eval_runs.EvalRunViewSet, basename="evalrun")

urlpatterns = [
    path("fit-check/", views.fit_check_view, name="fit-check"),
    *router.urls,
]
