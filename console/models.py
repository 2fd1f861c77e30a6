"""Users and roles, tenants, API keys and quotas."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractUser
from django.db import models
from django.utils import timezone

from console.choices import Role, SloClass


class User(AbstractUser):
    """A person who signs in to the console; what they may do follows from `role`."""

    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)

    @property
    def is_admin_role(self) -> bool:
        return self.is_superuser or self.role == Role.ADMIN


class Tenant(models.Model):
    """A customer of the proxy: owns API keys, has quotas, and is billed for its tokens."""

    name = models.CharField(max_length=100, unique=True)
    description = models.TextField(blank=True, default="")
    is_active = models.BooleanField(default=True)
    # Prompts and outputs are kept in the request log only when the tenant opts in.
    log_prompts = models.BooleanField(default=False)
    # Whether this tenant's requests may be mirrored to a shadow candidate (its prompts and the
    # candidate's answers are then stored for comparison). Off by default: mirroring is a data-use
    # decision the tenant's owner makes, not the rollout's.
    shadow_consent = models.BooleanField(default=False)
    # Its requests' latency class (TTFT and time-per-token targets, settings.PROXY_SLO_CLASSES), for
    # pools routed by the `slo_cost` scorer; blank: settings.PROXY_DEFAULT_SLO_CLASS.
    slo_class = models.CharField(max_length=16, choices=SloClass.choices, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Quota(models.Model):
    """Limits for a tenant, or an override for one API key. A null limit means unlimited."""

    tenant = models.OneToOneField(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="quota"
    )
    api_key = models.OneToOneField(
        "ApiKey", null=True, blank=True, on_delete=models.CASCADE, related_name="quota_override"
    )
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveIntegerField(null=True, blank=True)
    max_concurrent_requests = models.PositiveIntegerField(null=True, blank=True)
    daily_token_budget = models.PositiveBigIntegerField(null=True, blank=True)
    max_input_tokens = models.PositiveIntegerField(null=True, blank=True)
    max_output_tokens = models.PositiveIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    LIMIT_FIELDS = (
        "requests_per_minute",
        "tokens_per_minute",
        "max_concurrent_requests",
        "daily_token_budget",
        "max_input_tokens",
        "max_output_tokens",
    )

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(models.Q(tenant__isnull=False, api_key__isnull=True))
                | (models.Q(tenant__isnull=True, api_key__isnull=False)),
                name="quota_owner_exactly_one",
            )
        ]

    def __str__(self) -> str:
        owner = self.tenant or self.api_key
        return f"quota for {owner}"

    def limits(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.LIMIT_FIELDS}


class ApiKey(models.Model):
    """A tenant's credential for `/v1/`. Only a keyed hash and a short visible prefix are stored."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, db_index=True)
    hashed_key = models.CharField(max_length=64, unique=True)
    # Model aliases this key may call; empty means every alias.
    scopes = models.JSONField(default=list, blank=True)
    # Overrides the tenant's latency class for this key's requests (a batch job's key); blank: the
    # tenant's.
    slo_class = models.CharField(max_length=16, choices=SloClass.choices, blank=True, default="")
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or self.expires_at > timezone.now()
