from __future__ import annotations

from django.db import models


class AuditAction(models.TextChoices):
    CREATE = "create", "Create"
    UPDATE = "update", "Update"
    DELETE = "delete", "Delete"
    REVOKE = "revoke", "Revoke"
    SWITCH = "switch", "Switch"
    ACTION = "action", "Action"
