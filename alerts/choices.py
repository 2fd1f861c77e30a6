"""Choices of the alerts app: the rules (one per Prometheus alert), alert states, events, deliveries."""

from __future__ import annotations

from django.db import models


class Metric(models.TextChoices):
    ENGINE_DOWN = "engine_down", "Engine down"
    ENGINE_CRASH_LOOPING = "engine_crash_looping", "Engine crash-looping"
    HOST_DOWN = "host_down", "Host down"
    GPU_MEMORY_HIGH = "gpu_memory_high", "GPU memory high"
    GPU_TEMPERATURE_HIGH = "gpu_temperature_high", "GPU temperature high"
    KV_CACHE_SATURATED = "kv_cache_saturated", "KV cache saturated"
    QUEUE_GROWING = "queue_growing", "Queue growing"
    TTFT_P95_OVER_BASELINE = "ttft_p95_over_baseline", "TTFT p95 over baseline"
    HIGH_5XX_RATIO = "high_5xx_ratio", "5xx ratio high"
    TENANT_NEAR_BUDGET = "tenant_near_budget", "Tenant near its budget"


class Severity(models.TextChoices):
    CRITICAL = "critical", "Critical"
    WARNING = "warning", "Warning"
    INFO = "info", "Info"


class AlertState(models.TextChoices):
    # The condition holds but not yet for the rule's for-duration: no notification, no badge.
    PENDING = "pending", "Pending"
    FIRING = "firing", "Firing"
    RESOLVED = "resolved", "Resolved"


OPEN_STATES = (AlertState.PENDING, AlertState.FIRING)


class EventKind(models.TextChoices):
    PENDING = "pending", "Pending"
    FIRING = "firing", "Firing"
    RESOLVED = "resolved", "Resolved"
    ACKNOWLEDGED = "acknowledged", "Acknowledged"


class Transition(models.TextChoices):
    """The state changes that send a webhook message (one each per alert)."""

    FIRING = "firing", "Firing"
    RESOLVED = "resolved", "Resolved"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    SENT = "sent", "Sent"
    FAILED = "failed", "Failed (gave up)"
