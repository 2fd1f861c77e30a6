from __future__ import annotations

from django.db import models


class Role(models.TextChoices):
    ADMIN = "admin", "Admin"
    EVALUATOR = "evaluator", "Evaluator"
    VIEWER = "viewer", "Viewer"
