from __future__ import annotations

from django.urls import path
from rest_framework.routers import DefaultRouter

from console.api import views

router = DefaultRouter()
router.register("tenants", views.TenantViewSet, basename="tenant")
router.register("keys", views.ApiKeyViewSet, basename="apikey")
router.register("users", views.UserViewSet, basename="user")

urlpatterns = [
    path("auth/csrf/", views.csrf, name="auth-csrf"),
    path("auth/login/", views.login_view, name="auth-login"),
    path("auth/logout/", views.logout_view, name="auth-logout"),
    path("auth/me/", views.me, name="auth-me"),
    *router.urls,
]
