from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.auth import password_validation
from django.db import transaction
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from console.choices import Role
from console.models import ApiKey, Quota, Tenant, User
from console.permissions import user_role
from console.scopes import alias_names
from console.services import default_tenant_quota
from core.api.base import StrictModelSerializer, StrictSerializerMixin


class QuotaSerializer(StrictModelSerializer):
    """Limits; null means unlimited. Negative numbers are refused by the field types."""

    class Meta:
        model = Quota
        fields = list(Quota.LIMIT_FIELDS)


def save_quota(owner_field: str, owner: Any, data: dict[str, Any] | None) -> None:
    """Create, update or (with None) delete the quota that belongs to `owner`."""
    if data is None:
        Quota.objects.filter(**{owner_field: owner}).delete()
        return
    Quota.objects.update_or_create(**{owner_field: owner}, defaults=data)


class TenantSerializer(StrictModelSerializer):
    quota = QuotaSerializer(
        required=False,
        allow_null=True,
        help_text="Its limits; null: none. A tenant created without one gets the default quota "
        "(GET /api/tenants/defaults/), and the limits a new tenant's quota names replace the defaults'.",
    )
    key_count = serializers.SerializerMethodField()

    class Meta:
        model = Tenant
        fields = [
            "id",
            "name",
            "description",
            "is_active",
            "log_prompts",
            "shadow_consent",
            "slo_class",
            "quota",
            "key_count",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["id", "created_at", "updated_at", "key_count"]

    def get_key_count(self, obj: Tenant) -> int:
        return sum(1 for key in obj.api_keys.all() if key.revoked_at is None)

    def create(self, validated_data: dict[str, Any]) -> Tenant:
        # A new tenant starts with the default quota; the limits the request names replace those, and
        # `"quota": null` asks for none at all (an explicit choice, never an omission).
        quota: dict[str, Any] | None = default_tenant_quota()
        if "quota" in validated_data:
            given = validated_data.pop("quota")
            quota = None if given is None else {**(quota or {}), **given}
        with transaction.atomic():
            tenant = Tenant.objects.create(**validated_data)
            if quota is not None and any(value is not None for value in quota.values()):
                save_quota("tenant", tenant, quota)
        return tenant

    def update(self, instance: Tenant, validated_data: dict[str, Any]) -> Tenant:
        has_quota = "quota" in validated_data
        quota = validated_data.pop("quota", None)
        with transaction.atomic():
            instance = super().update(instance, validated_data)
            if has_quota:
                save_quota("tenant", instance, quota)
        return Tenant.objects.prefetch_related("api_keys").select_related("quota").get(pk=instance.pk)


class TenantDefaultsSerializer(serializers.Serializer):
    quota = QuotaSerializer(help_text="The limits a new tenant starts with; null is no limit.")


MAX_NAMED_ALIASES = 20  # in an error: enough to spot a typo, short enough to read


def _validate_scopes(value: list[str], kept: Iterable[str] = ()) -> list[str]:
    """Alias names, each once, each one the proxy can route (`kept`: names the key already had, which
    stay allowed after their alias is gone, so that saving a key does not fail for an old scope)."""
    cleaned = [s.strip() for s in value]
    if any(not s for s in cleaned):
        raise serializers.ValidationError("Scopes must be non-empty model alias names.")
    if len(set(cleaned)) != len(cleaned):
        raise serializers.ValidationError("Scopes must not repeat an alias.")
    known = alias_names()
    if known is not None:
        allowed = {*known, *kept}
        unknown = [s for s in cleaned if s not in allowed]
        if unknown:
            names = ", ".join(f"'{s}'" for s in unknown)
            more = ", ..." if len(known) > MAX_NAMED_ALIASES else ""
            listed = ", ".join(known[:MAX_NAMED_ALIASES]) + more
            raise serializers.ValidationError(
                f"No model alias named {names}. A key may be scoped to: {listed or 'no alias yet'} "
                "(GET /api/keys/scope-aliases/ lists them)."
            )
    return cleaned


class ScopeAliasesSerializer(serializers.Serializer):
    aliases = serializers.ListField(
        child=serializers.CharField(), help_text="Every model alias a key's scopes may name, sorted."
    )


class ApiKeySerializer(StrictModelSerializer):
    """A key as listed and edited: never the secret, never the hash."""

    quota_override = QuotaSerializer(required=False, allow_null=True)
    scopes = serializers.ListField(
        child=serializers.CharField(max_length=100),
        required=False,
        help_text="The model aliases this key may call; empty: every alias, including ones added later. "
        "Each must be an alias the proxy can route (GET /api/keys/scope-aliases/).",
    )
    tenant_name = serializers.CharField(source="tenant.name", read_only=True)
    is_active = serializers.BooleanField(read_only=True)

    class Meta:
        model = ApiKey
        fields = [
            "id",
            "tenant",
            "tenant_name",
            "name",
            "prefix",
            "scopes",
            "slo_class",
            "expires_at",
            "revoked_at",
            "last_used_at",
            "created_at",
            "is_active",
            "quota_override",
        ]
        read_only_fields = [
            "id",
            "prefix",
            "revoked_at",
            "last_used_at",
            "created_at",
            "tenant_name",
            "is_active",
        ]

    def get_fields(self) -> dict[str, Any]:
        fields = super().get_fields()
        if self.instance is not None and not isinstance(self.instance, list | tuple):
            fields["tenant"].read_only = True  # a key never moves between tenants
        return fields

    def validate_scopes(self, value: list[str]) -> list[str]:
        kept = self.instance.scopes if isinstance(self.instance, ApiKey) else []
        return _validate_scopes(value, kept or [])

    def validate_expires_at(self, value: Any) -> Any:
        if value is not None and value <= timezone.now():
            raise serializers.ValidationError("Expiry must be in the future.")
        return value

    def update(self, instance: ApiKey, validated_data: dict[str, Any]) -> ApiKey:
        has_quota = "quota_override" in validated_data
        quota = validated_data.pop("quota_override", None)
        with transaction.atomic():
            instance = super().update(instance, validated_data)
            if has_quota:
                save_quota("api_key", instance, quota)
        return instance


class ApiKeyCreatedSerializer(ApiKeySerializer):
    """The one response that carries the raw key."""

    key = serializers.CharField(read_only=True, help_text="The secret. Shown once; store it now.")

    class Meta(ApiKeySerializer.Meta):
        fields = [*ApiKeySerializer.Meta.fields, "key"]


class UserSerializer(StrictModelSerializer):
    password = serializers.CharField(write_only=True, required=False, style={"input_type": "password"})

    class Meta:
        model = User
        fields = ["id", "username", "email", "role", "is_active", "password", "last_login", "date_joined"]
        read_only_fields = ["id", "last_login", "date_joined"]

    def validate_password(self, value: str) -> str:
        password_validation.validate_password(value)
        return value

    def create(self, validated_data: dict[str, Any]) -> User:
        password = validated_data.pop("password", None)
        user = User(**validated_data)
        if password:
            user.set_password(password)
        else:
            user.set_unusable_password()
        user.save()
        return user

    def update(self, instance: User, validated_data: dict[str, Any]) -> User:
        password = validated_data.pop("password", None)
        instance = super().update(instance, validated_data)
        if password:
            instance.set_password(password)
            instance.save(update_fields=["password"])
        return instance


class LoginSerializer(StrictSerializerMixin, serializers.Serializer):
    username = serializers.CharField()
    password = serializers.CharField(style={"input_type": "password"})


class CsrfSerializer(serializers.Serializer):
    csrfToken = serializers.CharField(help_text="Also set as the csrftoken cookie.")


class MeSerializer(serializers.ModelSerializer):
    role = serializers.SerializerMethodField()

    class Meta:
        model = User
        fields = ["id", "username", "email", "role"]

    @extend_schema_field(serializers.ChoiceField(choices=Role.choices))
    def get_role(self, obj: User) -> str:
        return user_role(obj) or ""
