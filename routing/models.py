"""Route pools and policies (what the proxy routes by) and the request log (what it did)."""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from routing.choices import Scorer


class RoutePool(models.Model):
    """A set of endpoints: the ready deployments that serve `alias` (optionally only those with `role`).

    The scorer picks one endpoint per request; timeouts and the saturation bound apply to every endpoint.
    """

    name = models.CharField(max_length=100, unique=True)
    # The served model name (ModelAlias.name) whose ready deployments make up the pool.
    alias = models.CharField(max_length=100)
    role = models.CharField(max_length=32, blank=True, default="")
    # Empty: the pool serves the alias's active version (and follows a switch). Set: the pool serves
    # this version's deployments whatever the active version is (a tier on purpose, such as the
    # demo's quantized fast pool); only an operator's explicit choice, never a fallback.
    model_version = models.ForeignKey(
        "models_registry.ModelVersion",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="route_pools",
    )
    scorer = models.CharField(max_length=32, choices=Scorer.choices, default=Scorer.LEAST_OUTSTANDING)
    # For the weighted scorer: {"load": 1.0, "kv": 1.0, "prefix": 0.5}; ignored by the others.
    scorer_weights = models.JSONField(default=dict, blank=True)
    session_header = models.CharField(max_length=64, default="x-session-id")
    connect_timeout_s = models.FloatField(default=2.0)
    first_byte_timeout_s = models.FloatField(default=60.0)
    total_timeout_s = models.FloatField(default=600.0)
    max_retries = models.PositiveSmallIntegerField(default=2)
    # The pool's capacity is this times its endpoints: in-flight requests up to it count as room.
    max_inflight_per_endpoint = models.PositiveIntegerField(default=64)
    # Share of the capacity batch traffic may fill; the rest is headroom kept for interactive requests,
    # so batch is shed (429) once in-flight reaches it while interactive is still admitted.
    batch_max_fraction = models.FloatField(
        default=0.8, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)]
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class RoutePolicy(models.Model):
    """How requests for one alias pick a pool: ordered branch rules, then a fallback pool.

    Each rule is {"match": {...}, "pool": "<pool name>"}; match keys (all optional, all must hold):
    `alias` (list), `min_prompt_tokens`, `max_prompt_tokens`, `task` (list of x-task header values),
    `tenant` (list of tenant names), `priority` ("interactive" or "batch"). An alias with no policy
    routes to the pool of the same name, or else to all its ready deployments.
    """

    name = models.CharField(max_length=100, unique=True)
    alias = models.CharField(max_length=100, unique=True)
    rules = models.JSONField(default=list, blank=True)
    default_pool = models.ForeignKey(
        RoutePool, null=True, blank=True, on_delete=models.PROTECT, related_name="default_for"
    )
    fallback_pool = models.ForeignKey(
        RoutePool, null=True, blank=True, on_delete=models.PROTECT, related_name="fallback_for"
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "route policies"

    def __str__(self) -> str:
        return self.name


class RequestLog(models.Model):
    """One row per `/v1/` request: who, which model and endpoint, outcome, tokens, timings, route.

    Written in batches by the proxy. On PostgreSQL the table is partitioned by UTC day of `created_at`
    (migration 0003; primary key (id, created_at) there, `id` alone to Django) and retention drops
    whole days past `REQUEST_LOG_RETENTION_DAYS`; on SQLite a periodic task deletes old rows.
    Prompt and output text are kept only for tenants with `log_prompts`.
    """

    created_at = models.DateTimeField(default=timezone.now)
    request_id = models.CharField(max_length=40, blank=True, default="")
    tenant_id = models.BigIntegerField(null=True, blank=True)
    tenant_name = models.CharField(max_length=100, blank=True, default="")
    key_prefix = models.CharField(max_length=16, blank=True, default="")
    endpoint_kind = models.CharField(max_length=32, blank=True, default="")
    alias = models.CharField(max_length=100, blank=True, default="")
    deployment_id = models.BigIntegerField(null=True, blank=True)
    # The model version that answered (the deployment's at the time; empty for static endpoints and
    # for requests no engine saw). A plain id like deployment_id: the log outlives the rows it names.
    model_version_id = models.BigIntegerField(null=True, blank=True)
    upstream = models.CharField(max_length=200, blank=True, default="")
    status = models.PositiveSmallIntegerField()
    error_type = models.CharField(max_length=64, blank=True, default="")
    stream = models.BooleanField(default=False)
    priority = models.CharField(max_length=16, blank=True, default="")
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    prompt_tokens_estimated = models.BooleanField(default=False)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    ttft_ms = models.FloatField(null=True, blank=True)
    latency_ms = models.FloatField(null=True, blank=True)
    retries = models.PositiveSmallIntegerField(default=0)
    route_pool = models.CharField(max_length=100, blank=True, default="")
    route_reason = models.CharField(max_length=200, blank=True, default="")
    prompt_text = models.TextField(null=True, blank=True)
    response_text = models.TextField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["created_at"], name="reqlog_created"),
            models.Index(fields=["tenant_id", "created_at"], name="reqlog_tenant_created"),
            models.Index(fields=["alias", "created_at"], name="reqlog_alias_created"),
            models.Index(fields=["status", "created_at"], name="reqlog_status_created"),
        ]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.alias} {self.status}"
