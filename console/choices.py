from __future__ import annotations

from django.db import models


class Role(models.TextChoices):
    ADMIN = "admin", "Admin"
    EVALUATOR = "evaluator", "Evaluator"
    VIEWER = "viewer", "Viewer"


class AuditAction(models.TextChoices):
    CREATE = "create", "Create"
    UPDATE = "update", "Update"
    DELETE = "delete", "Delete"
    REVOKE = "revoke", "Revoke"
    SWITCH = "switch", "Switch"
    ACTION = "action", "Action"
