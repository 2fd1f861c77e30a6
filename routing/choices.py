"""Choices shared by routing models, the admin API and the proxy."""

from __future__ import annotations

from django.db import models


class Scorer(models.TextChoices):
    ROUND_ROBIN = "round_robin", "Round robin"
    RANDOM = "random", "Random"
    LEAST_OUTSTANDING = "least_outstanding", "Least outstanding requests"
    BEST_FIT = "best_fit", "Best fit on free KV-cache tokens"
    PREFIX_AFFINITY = "prefix_affinity", "Prefix affinity (bounded-load consistent hashing)"
    SESSION_AFFINITY = "session_affinity", "Session affinity by header"
    WEIGHTED = "weighted", "Weighted combination"


class Priority(models.TextChoices):
    INTERACTIVE = "interactive", "Interactive"
    BATCH = "batch", "Batch"


class RollupKind(models.TextChoices):
    """What a history series is of (routing/rollups/): its subject names one of these."""

    GPU = "gpu", "GPU"
    ENGINE = "engine", "Engine (deployment)"
    POOL = "pool", "Route pool"
    TENANT = "tenant", "Tenant"
