"""Choices shared by routing models, the admin API and the proxy."""

from __future__ import annotations

from django.db import models

from console.choices import SloClass

__all__ = ["Priority", "RollupKind", "Scorer", "SloClass"]


class Scorer(models.TextChoices):
    ROUND_ROBIN = "round_robin", "Round robin"
    RANDOM = "random", "Random"
    LEAST_OUTSTANDING = "least_outstanding", "Least outstanding requests"
    BEST_FIT = "best_fit", "Best fit on free KV-cache tokens"
    PREFIX_AFFINITY = "prefix_affinity", "Prefix affinity (bounded-load consistent hashing)"
    SESSION_AFFINITY = "session_affinity", "Session affinity by header"
    WEIGHTED = "weighted", "Weighted combination"
    PREDICTED_LATENCY = "predicted_latency", "Soonest predicted completion (learnt online)"
    SLO_COST = "slo_cost", "Cheapest predicted to meet the SLO class"


class Priority(models.TextChoices):
    INTERACTIVE = "interactive", "Interactive"
    BATCH = "batch", "Batch"


class RollupKind(models.TextChoices):
    """What a history series is of (routing/rollups/): its subject names one of these."""

    GPU = "gpu", "GPU"
    ENGINE = "engine", "Engine (deployment)"
    POOL = "pool", "Route pool"
    TENANT = "tenant", "Tenant"
