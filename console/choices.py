from __future__ import annotations

from django.db import models


class Role(models.TextChoices):
    ADMIN = "admin", "Admin"
    EVALUATOR = "evaluator", "Evaluator"
    VIEWER = "viewer", "Viewer"


class SloClass(models.TextChoices):
    """A request's latency class: its TTFT and time-per-output-token targets are settings
    (PROXY_SLO_CLASSES); the `slo_cost` scorer sends it to the cheapest engine predicted to meet them."""

    INTERACTIVE = "interactive", "Interactive"
    STANDARD = "standard", "Standard"
    BATCH = "batch", "Batch"
