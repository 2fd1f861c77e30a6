from __future__ import annotations

from rest_framework.routers import DefaultRouter

from core.api import views

router = DefaultRouter()
router.register("audit", views.AuditEventViewSet, basename="audit")

urlpatterns = router.urls
