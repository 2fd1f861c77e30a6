"""URL root: the API, its schema and docs, the Django admin, and the SPA for every other path."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from inferchain.views import spa_index
from routing.fleet_metrics import metrics_view

# Each app contributes its API under /api/ through its own api/urls.py.
api_patterns = [
    path("", include("core.api.urls")),
    path("", include("console.api.urls")),
    path("", include("models_registry.api.urls")),
    path("", include("nodes.api.urls")),
    path("", include("routing.api.urls")),
    path("", include("alerts.api.urls")),
]

urlpatterns = [
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # Swagger UI's init script is served as a file here, so the page runs under a CSP with no inline script.
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    path("api/", include(api_patterns)),
    path("django-admin/", admin.site.urls),
    # The fleet's Prometheus exposition (GPUs, engines, tenants' budgets); the proxy's is /v1/metrics.
    path("metrics", metrics_view, name="fleet-metrics"),
    re_path(r"^(?!api/|static/|ws/|v1/|django-admin/|metrics$).*$", spa_index, name="spa"),
]
