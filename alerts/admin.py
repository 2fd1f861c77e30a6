from __future__ import annotations

from django.contrib import admin

from alerts.models import Alert, AlertRule


@admin.register(AlertRule)
class AlertRuleAdmin(admin.ModelAdmin):
    list_display = ["metric", "deployment", "pool", "threshold", "for_seconds", "enabled"]


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin):
    list_display = ["metric", "subject", "state", "started_at", "fired_at", "resolved_at"]
    list_filter = ["state", "metric"]
