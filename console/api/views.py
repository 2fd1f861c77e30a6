from __future__ import annotations

from typing import Any

import django_filters
from django.contrib.auth import authenticate, login, logout
from django.db import transaction
from django.db.models import Prefetch
from django.middleware.csrf import get_token
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.authentication import SessionAuthentication
from rest_framework.decorators import action, api_view, permission_classes
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from console import login_throttle
from console.api.serializers import (
    ApiKeyCreatedSerializer,
    ApiKeySerializer,
    CsrfSerializer,
    LoginSerializer,
    MeSerializer,
    ScopeAliasesSerializer,
    TenantDefaultsSerializer,
    TenantSerializer,
    UserSerializer,
    save_quota,
)
from console.models import ApiKey, Tenant, User
from console.scopes import alias_names
from console.services import default_tenant_quota, issue_api_key, revoke_api_key
from core.api.base import AuditedModelViewSet
from core.audit import record_audit
from core.choices import AuditAction
from core.redis_client import publish_config_change


class TenantViewSet(AuditedModelViewSet):
    serializer_class = TenantSerializer
    filterset_fields = ["is_active"]
    search_fields = ["name", "description"]
    ordering_fields = ["name", "created_at"]

    def get_queryset(self) -> Any:
        return Tenant.objects.select_related("quota").prefetch_related(
            Prefetch("api_keys", queryset=ApiKey.objects.only("id", "tenant_id", "revoked_at"))
        )

    @extend_schema(request=None, responses={200: TenantDefaultsSerializer})
    @action(detail=False, methods=["get"], filter_backends=[], pagination_class=None)
    def defaults(self, request: Request) -> Response:
        """What a new tenant starts with: the default quota (settings `DEFAULT_TENANT_QUOTA_*`)."""
        return Response(TenantDefaultsSerializer({"quota": default_tenant_quota()}).data)

    def perform_update(self, serializer: Any) -> None:
        super().perform_update(serializer)
        publish_config_change("tenant", id=serializer.instance.pk)

    def perform_destroy(self, instance: Any) -> None:
        pk = instance.pk
        super().perform_destroy(instance)
        publish_config_change("tenant", id=pk)


class ApiKeyFilter(django_filters.FilterSet):
    active = django_filters.BooleanFilter(method="filter_active")

    class Meta:
        model = ApiKey
        fields = ["tenant"]

    def filter_active(self, queryset: Any, name: str, value: bool) -> Any:
        return queryset.filter(revoked_at__isnull=value)


class ApiKeyViewSet(AuditedModelViewSet):
    """API keys. Created with the secret in the response, once; revoked, never deleted."""

    serializer_class = ApiKeySerializer
    filterset_class = ApiKeyFilter
    search_fields = ["name", "prefix"]
    ordering_fields = ["created_at", "last_used_at", "name"]
    http_method_names = ["get", "post", "patch", "put", "head", "options"]

    def get_queryset(self) -> Any:
        return ApiKey.objects.select_related("tenant", "quota_override")

    @extend_schema(request=ApiKeySerializer, responses={201: ApiKeyCreatedSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        with transaction.atomic():
            issued = issue_api_key(
                tenant=data["tenant"],
                name=data["name"],
                scopes=data.get("scopes"),
                expires_at=data.get("expires_at"),
                created_by=request.user,  # type: ignore[arg-type]
            )
            if data.get("quota_override") is not None:
                save_quota("api_key", issued.api_key, data["quota_override"])
            record_audit(
                actor=request.user,
                action=AuditAction.CREATE,
                obj=issued.api_key,
                after=self.snapshot(issued.api_key),
            )
        body = dict(ApiKeyCreatedSerializer(issued.api_key).data)
        body["key"] = issued.raw_key
        return Response(body, status=status.HTTP_201_CREATED)

    def perform_update(self, serializer: Any) -> None:
        # The proxies drop their copy of the key, so a new scope or quota applies at the next request.
        super().perform_update(serializer)
        publish_config_change("api_key", id=serializer.instance.pk, hashed_key=serializer.instance.hashed_key)

    @extend_schema(request=None, responses={200: ScopeAliasesSerializer})
    @action(
        detail=False, methods=["get"], url_path="scope-aliases", filter_backends=[], pagination_class=None
    )
    def scope_aliases(self, request: Request) -> Response:
        """Every model alias a key's scopes may name: what the key dialogs offer."""
        return Response(ScopeAliasesSerializer({"aliases": alias_names() or []}).data)

    @extend_schema(request=None, responses={200: ApiKeySerializer})
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str | None = None) -> Response:
        """Revoke the key. Revoking a revoked key is a no-op that returns the same state."""
        api_key = self.get_object()
        revoke_api_key(api_key, actor=request.user)  # type: ignore[arg-type]
        return Response(self.get_serializer(api_key).data)


class UserViewSet(AuditedModelViewSet):
    """Console accounts; admins only."""

    admin_only = True
    serializer_class = UserSerializer
    queryset = User.objects.order_by("username")
    filterset_fields = ["role", "is_active"]
    search_fields = ["username", "email"]


def _enforce_csrf(request: Request) -> None:
    """Refuse (403 "CSRF Failed: ...") a browser write without the CSRF token, as for signed-in writes."""
    SessionAuthentication().enforce_csrf(request)


@extend_schema(request=None, responses={200: CsrfSerializer})
@api_view(["GET"])
@permission_classes([AllowAny])
def csrf(request: Request) -> Response:
    """Sets the CSRF cookie the SPA sends back on writes."""
    return Response(CsrfSerializer({"csrfToken": get_token(request._request)}).data)


@extend_schema(
    request=LoginSerializer,
    responses={
        200: MeSerializer,
        403: OpenApiResponse(description="No valid CSRF token (fetch one from /api/auth/csrf/)."),
        429: OpenApiResponse(
            description="Too many failed sign-ins for this username or from this address; "
            "`detail` says when to try again (also in `retry_after` and the Retry-After header)."
        ),
    },
)
@api_view(["POST"])
@permission_classes([AllowAny])
def login_view(request: Request) -> Response:
    # DRF checks CSRF only for a signed-in session; sign-in itself is checked too, so another site
    # cannot sign a browser into an account of its choosing.
    _enforce_csrf(request)
    serializer = LoginSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    username = serializer.validated_data["username"]
    address = login_throttle.client_address(request._request)
    refused = login_throttle.refusal(username, address)
    if refused is not None:
        return Response(
            {
                "detail": f"Too many failed sign-ins from this {refused.by}. "
                f"Try again in {refused.retry_after} seconds.",
                "retry_after": refused.retry_after,
            },
            status=status.HTTP_429_TOO_MANY_REQUESTS,
            headers={"Retry-After": str(refused.retry_after)},
        )
    user = authenticate(request._request, username=username, password=serializer.validated_data["password"])
    if user is None or not user.is_active:
        login_throttle.record_failure(username, address)
        return Response(
            {"non_field_errors": ["Wrong username or password."]}, status=status.HTTP_400_BAD_REQUEST
        )
    login_throttle.record_success(username, address)
    login(request._request, user)
    return Response(MeSerializer(user).data)


@extend_schema(request=None, responses={204: None})
@api_view(["POST"])
@permission_classes([AllowAny])
def logout_view(request: Request) -> Response:
    _enforce_csrf(request)
    logout(request._request)
    return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema(responses={200: MeSerializer})
@api_view(["GET"])
@permission_classes([IsAuthenticated])
def me(request: Request) -> Response:
    return Response(MeSerializer(request.user).data)
