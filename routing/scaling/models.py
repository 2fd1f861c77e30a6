"""A route pool's scaling policy and its decision history (routing/scaling/autoscaler.py decides).

They live in routing because a policy belongs to one RoutePool (routing may point at nodes' deployments,
nodes never at routing's pools). The tables keep the names they had when the models were in the nodes
app (moved, not copied: migrations nodes 0009 and routing 0013). routing/models.py imports them, so that
they are registered with the app.
"""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from nodes.models import Deployment


class ScalingPolicy(models.Model):
    """How one route pool grows and shrinks with load (routing/scaling/autoscaler.py decides, beat runs it).

    The scaler keeps between `min_engines` and `max_engines` engines in the pool, each a copy of
    `template` (its model version, quantization and engine arguments) placed by the preflight/fit check
    on a host of the pool's role. It adds one when any target is exceeded (waiting requests per engine,
    KV-cache usage, TTFT p95 over the template's baseline), and drains then removes one when the pool
    would still be well under every target with one engine fewer. The `last_*` fields are the latest
    evaluation, for the console.
    """

    pool = models.OneToOneField("routing.RoutePool", on_delete=models.CASCADE, related_name="scaling_policy")
    template = models.ForeignKey(Deployment, on_delete=models.PROTECT, related_name="scaling_templates")
    enabled = models.BooleanField(default=True)
    min_engines = models.PositiveSmallIntegerField(default=1)
    max_engines = models.PositiveSmallIntegerField(default=4)
    target_waiting_per_engine = models.FloatField(default=2.0, validators=[MinValueValidator(0.0)])
    # A share of the KV cache in use (0..1, as vLLM's kv_cache_usage_perc).
    target_kv_usage = models.FloatField(
        default=0.8, validators=[MinValueValidator(0.01), MaxValueValidator(1.0)]
    )
    # Live TTFT p95 over the template's newest baseline at the same load; null: not a target.
    target_ttft_ratio = models.FloatField(
        null=True, blank=True, default=None, validators=[MinValueValidator(1.0)]
    )
    scale_up_cooldown_s = models.PositiveIntegerField(default=30)
    scale_down_cooldown_s = models.PositiveIntegerField(default=300)
    evaluation_interval_s = models.PositiveIntegerField(default=10, validators=[MinValueValidator(1)])
    last_evaluated_at = models.DateTimeField(null=True, blank=True)
    last_target_engines = models.PositiveSmallIntegerField(null=True, blank=True)
    last_reason = models.TextField(blank=True, default="")
    last_metrics = models.JSONField(default=dict, blank=True)
    # Since when the pool has been quiet enough to lose an engine, without a break (null: not quiet).
    quiet_since = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "nodes_scalingpolicy"
        ordering = ["pool__name"]
        verbose_name_plural = "scaling policies"

    def __str__(self) -> str:
        return f"scaling of {self.pool_id}"


class ScalingDecision(models.Model):
    """One decision of a pool's scaler, with the numbers it was taken on: the pool's scaling history.

    At most one per policy and evaluation interval (`interval`: seconds since the epoch divided by the
    policy's interval), so a task run twice in one interval decides once.
    """

    class Action(models.TextChoices):
        SCALE_UP = "scale_up", "Scale up"
        SCALE_DOWN = "scale_down", "Scale down"
        # An engine the scaler added was lost with its host before it served: removed, placed elsewhere.
        REPLACE = "replace", "Replace"
        # The scaler wanted to change the pool but could not (no host fits, at the maximum).
        BLOCKED = "blocked", "Blocked"

    policy = models.ForeignKey(ScalingPolicy, on_delete=models.CASCADE, related_name="decisions")
    at = models.DateTimeField(db_index=True)
    interval = models.BigIntegerField()
    action = models.CharField(max_length=16, choices=Action.choices)
    reason = models.TextField()
    engines_before = models.PositiveSmallIntegerField()
    engines_after = models.PositiveSmallIntegerField()
    metrics = models.JSONField(default=dict, blank=True)
    # The engine added or removed (null once it is deleted; its name stays).
    deployment = models.ForeignKey(
        Deployment, null=True, blank=True, on_delete=models.SET_NULL, related_name="scaling_decisions"
    )
    deployment_name = models.CharField(max_length=100, blank=True, default="")
    host_name = models.CharField(max_length=63, blank=True, default="")

    class Meta:
        db_table = "nodes_scalingdecision"
        ordering = ["-at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["policy", "interval"], name="scaling_decision_once_per_interval")
        ]

    def __str__(self) -> str:
        return f"{self.policy_id} {self.at:%H:%M:%S} {self.action}"
