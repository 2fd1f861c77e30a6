from typing import Any

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin
from django.http import HttpRequest

from console.models import ApiKey, Quota, Tenant, User
from console.services import default_tenant_quota

admin.site.register(User, UserAdmin)


class TenantQuotaInline(admin.StackedInline):
    model = Quota
    fk_name = "tenant"
    fields = Quota.LIMIT_FIELDS
    max_num = 1
    can_delete = True


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    inlines = [TenantQuotaInline]

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        # A tenant added here starts with the default quota too, as through the API and console
        # (console/api/serializers.py TenantSerializer.create): Django's admin is another door to
        # the same table, and a safe default that one door skips is not a default. Limits typed into
        # the inline replace the defaults; an existing tenant is never given one on save.
        super().save_related(request, form, formsets, change)
        if change or Quota.objects.filter(tenant=form.instance).exists():
            return
        quota = default_tenant_quota()
        if any(value is not None for value in quota.values()):
            Quota.objects.create(tenant=form.instance, **quota)


admin.site.register(Quota)
admin.site.register(ApiKey)
