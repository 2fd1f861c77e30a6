"""The audit log, written by every app through `core.audit.record_audit`."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from core.choices import AuditAction


class AuditEvent(models.Model):
    """One administrative change: who did what to which object, with before/after (secrets redacted)."""

    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(max_length=150, blank=True, default="")
    action = models.CharField(max_length=16, choices=AuditAction.choices)
    object_type = models.CharField(max_length=64, db_index=True)
    object_id = models.CharField(max_length=64, blank=True, default="")
    object_repr = models.CharField(max_length=200, blank=True, default="")
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        # The table keeps the name it had when the audit log lived in the console app (moved, not copied).
        db_table = "console_auditevent"
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.actor_name} {self.action} {self.object_type}:{self.object_id}"
