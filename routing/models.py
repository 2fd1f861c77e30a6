"""Route pools and policies (what the proxy routes by) and the request log (what it did)."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from routing.choices import RollupKind, Scorer

# A pool's scaling policy and its decisions live with the autoscaler in routing/scaling/; imported here
# so that Django registers them with the routing app when it loads routing.models.
from routing.scaling.models import ScalingDecision, ScalingPolicy  # noqa: F401


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
    # A stream that sends nothing for this long after its first byte has stalled (a hung engine): it
    # ends with an SSE error and counts as the endpoint's failure.
    inter_token_timeout_s = models.FloatField(default=30.0)
    total_timeout_s = models.FloatField(default=600.0)
    max_retries = models.PositiveSmallIntegerField(default=2)
    # The pool's capacity is this times its endpoints: in-flight requests up to it count as room.
    max_inflight_per_endpoint = models.PositiveIntegerField(default=64)
    # Share of the capacity batch traffic may fill; the rest is headroom kept for interactive requests,
    # so batch is shed (429) once in-flight reaches it while interactive is still admitted.
    batch_max_fraction = models.FloatField(
        default=0.8, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)]
    )
    # Sleep control for every deployment serving the pool (engines that support sleep mode): sleep after
    # this many idle seconds (null: off) at `sleep_level`. The pool keeps one engine awake unless
    # `scale_to_zero`, under which all may sleep and the first request wakes one.
    sleep_idle_seconds = models.PositiveIntegerField(null=True, blank=True, default=None)
    sleep_level = models.PositiveSmallIntegerField(default=1)
    scale_to_zero = models.BooleanField(default=False)
    # How long the proxy holds a request while a sleeping engine wakes (then 503 with Retry-After).
    wake_timeout_s = models.FloatField(default=30.0)
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
    # The request's stage chain, one object per stage in chain order: {"name", "kind", "outcome", "ms"}
    # (outcome e.g. pass, hit, miss, masked, blocked, "not run"); empty when no chain applied.
    stages = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["created_at"], name="reqlog_created"),
            models.Index(fields=["tenant_id", "created_at"], name="reqlog_tenant_created"),
            models.Index(fields=["alias", "created_at"], name="reqlog_alias_created"),
            models.Index(fields=["status", "created_at"], name="reqlog_status_created"),
            # The request log's lookups by request id and by key (migration 0015).
            models.Index(fields=["request_id"], name="reqlog_request_id"),
            models.Index(fields=["key_prefix", "created_at"], name="reqlog_key_created"),
        ]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.alias} {self.status}"


# -- rollouts: canaries and shadow traffic -----------------------------------------------------------------


class RolloutState(models.TextChoices):
    RUNNING = "running"  # the gate task advances the share step by step
    PAUSED = "paused"  # a person paused it; the share stays where it is
    HOLDING = "holding"  # the gate task could not decide (too little data, or sign-off missing)
    # The step's analysis passed at a step the plan marks for approval: an admin approves to go on.
    AWAITING_APPROVAL = "awaiting_approval"
    PROMOTED = "promoted"  # the candidate became the alias's active version
    ROLLED_BACK = "rolled_back"  # share set to 0 by a failed gate, a dead candidate or a person
    CANCELLED = "cancelled"


ACTIVE_ROLLOUT_STATES = (
    RolloutState.RUNNING,
    RolloutState.PAUSED,
    RolloutState.HOLDING,
    RolloutState.AWAITING_APPROVAL,
)


class StickyBy(models.TextChoices):
    SESSION = "session"  # the pool's session header, else the tenant
    TENANT = "tenant"


class Rollout(models.Model):
    """A canary: `candidate_version` takes `share` percent of `alias`'s traffic, raised step by step.

    `steps` are rising percentages ending at 100 (e.g. [1, 5, 25, 50, 100]); `step_index` is the step
    now serving and `share` its percentage (0 after a rollback). A step lasts at least
    `min_step_seconds` and `min_step_requests` candidate requests before the gate task
    (routing.rollouts) may advance it. `gates` holds the thresholds, each optional:
    `max_error_rate_delta` (candidate minus baseline), `max_p95_latency_ratio` and
    `max_ttft_p95_ratio` (candidate over baseline in the same window), `max_flip_rate`, `min_chrf`,
    `max_kl` (from shadow pairs or the signed-off offline run). Reaching 100% switches the alias's
    active version; with `require_signoff` only when an accepted offline evaluation of the candidate
    exists. At most one active rollout per alias (database constraint).

    The analysis of each step (routing.rollouts.analysis, docs/rollouts.md "Analysis"): `analysis` holds
    the limits (failure, inconclusive, consecutive errors), each gate's dry-run flag and minimum sample,
    as defaults and per gate; `analysis_state` the current step's measurement counts per gate, reset
    when the step changes or a person resumes. `approval_steps` are the percentages after whose passed
    analysis the rollout waits (`awaiting_approval`) until an admin approves.
    """

    alias = models.ForeignKey("models_registry.ModelAlias", on_delete=models.CASCADE, related_name="rollouts")
    # The alias's active version when the rollout started: what the candidate is compared with.
    baseline_version = models.ForeignKey(
        "models_registry.ModelVersion", on_delete=models.PROTECT, related_name="+"
    )
    candidate_version = models.ForeignKey(
        "models_registry.ModelVersion", on_delete=models.PROTECT, related_name="canary_rollouts"
    )
    steps = models.JSONField(default=list)
    step_index = models.PositiveSmallIntegerField(default=0)
    share = models.FloatField(default=0.0, validators=[MinValueValidator(0.0), MaxValueValidator(100.0)])
    state = models.CharField(max_length=20, choices=RolloutState.choices, default=RolloutState.RUNNING)
    sticky_by = models.CharField(max_length=16, choices=StickyBy.choices, default=StickyBy.SESSION)
    min_step_seconds = models.PositiveIntegerField(default=300)
    min_step_requests = models.PositiveIntegerField(default=100)
    gates = models.JSONField(default=dict, blank=True)
    require_signoff = models.BooleanField(default=False)
    analysis = models.JSONField(default=dict, blank=True)
    approval_steps = models.JSONField(default=list, blank=True)
    analysis_state = models.JSONField(default=dict, blank=True)
    step_started_at = models.DateTimeField(default=timezone.now)
    # The latest decision's reason, shown on the page without reading the history.
    reason = models.TextField(blank=True, default="")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["alias"],
                condition=models.Q(state__in=[s.value for s in ACTIVE_ROLLOUT_STATES]),
                name="one_active_rollout_per_alias",
            )
        ]

    def __str__(self) -> str:
        return f"{self.alias} -> {self.candidate_version} at {self.share:g}%"

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_ROLLOUT_STATES


class RolloutDecision(models.Model):
    """One entry of a rollout's history: what was decided, by whom (null: the gate task), and the numbers."""

    class Action(models.TextChoices):
        START = "start"
        ADVANCE = "advance"
        HOLD = "hold"
        ROLLBACK = "rollback"
        PROMOTE = "promote"
        PAUSE = "pause"
        RESUME = "resume"
        CANCEL = "cancel"
        AWAIT_APPROVAL = "await_approval"  # the step passed; an admin's approval is needed to go on
        APPROVE = "approve"

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="decisions")
    created_at = models.DateTimeField(default=timezone.now)
    action = models.CharField(max_length=16, choices=Action.choices)
    from_share = models.FloatField()
    to_share = models.FloatField()
    # The window's figures per side and each gate's value, threshold and verdict.
    numbers = models.JSONField(default=dict, blank=True)
    reason = models.TextField(blank=True, default="")
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["rollout", "created_at", "id"]

    def __str__(self) -> str:
        return f"{self.rollout_id}: {self.action} {self.from_share:g}% -> {self.to_share:g}%"


class ShadowConfig(models.Model):
    """Mirror `percent` of an alias's live requests (from consenting tenants) to `candidate_version`.

    The mirror is sent after the primary has answered, never billed to the tenant's quota, skipped
    (and counted) when the candidate is saturated or `max_inflight` mirrors are already out, and
    never seen by the client. Each mirrored pair is stored as a ShadowPair and scored.
    """

    alias = models.OneToOneField(
        "models_registry.ModelAlias", on_delete=models.CASCADE, related_name="shadow"
    )
    candidate_version = models.ForeignKey(
        "models_registry.ModelVersion", on_delete=models.PROTECT, related_name="shadow_configs"
    )
    percent = models.FloatField(validators=[MinValueValidator(0.0), MaxValueValidator(100.0)])
    enabled = models.BooleanField(default=True)
    max_inflight = models.PositiveIntegerField(default=4)
    timeout_s = models.FloatField(default=60.0)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"shadow {self.alias} -> {self.candidate_version} at {self.percent:g}%"


class ShadowPair(models.Model):
    """One mirrored request: the primary's answer, the candidate's, and their scores.

    Scored with the evaluation metrics (models_registry.evaluation.metrics): exact match, first
    divergence, chrF. Reviewed in the same side-by-side view as offline runs (`mark`, `comment`).
    """

    created_at = models.DateTimeField(default=timezone.now)
    request_id = models.CharField(max_length=40, blank=True, default="")
    alias = models.CharField(max_length=100)
    tenant_id = models.BigIntegerField(null=True, blank=True)
    endpoint_kind = models.CharField(max_length=32, blank=True, default="")
    primary_version_id = models.BigIntegerField(null=True, blank=True)
    candidate_version_id = models.BigIntegerField(null=True, blank=True)
    # The request as the client sent it (messages or prompt, sampling parameters).
    request = models.JSONField(default=dict, blank=True)
    primary_output = models.TextField(blank=True, default="")
    candidate_output = models.TextField(blank=True, default="")
    primary_latency_ms = models.FloatField(null=True, blank=True)
    candidate_latency_ms = models.FloatField(null=True, blank=True)
    candidate_status = models.PositiveSmallIntegerField(null=True, blank=True)
    candidate_error = models.TextField(blank=True, default="")
    exact_match = models.BooleanField(null=True)
    first_divergence = models.IntegerField(null=True, blank=True)
    chrf = models.FloatField(null=True, blank=True)
    scores = models.JSONField(default=dict, blank=True)
    # A reviewer's mark (models_registry.evaluation.models.SampleMark values; empty: unmarked), and who
    # gave it when (routing.rollouts.review). The name is kept beside the user, who may be deleted.
    mark = models.CharField(max_length=16, blank=True, default="")
    comment = models.TextField(blank=True, default="")
    marked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    marked_by_name = models.CharField(max_length=150, blank=True, default="")
    marked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["alias", "created_at"], name="shadowpair_alias_created")]

    def __str__(self) -> str:
        return f"{self.alias} {self.request_id}"


# -- history: the charts' downsampled rollups ---------------------------------------------------------------


class MetricRollup(models.Model):
    """One subject's numbers over one time bucket at one resolution (10 s, 1 min or 1 h).

    Subjects: a GPU (`<host>:<index>`), an engine (the deployment's id), a route pool (its name) or a
    tenant (its id). `values` holds a GPU's or engine's gauge means (`[n, mean, ...]`, n the samples
    behind them) or a pool's or tenant's request counts, tokens and latency histogram
    (routing/rollups/stats.py), so a coarser bucket is computed from finer ones exactly. Written in
    bulk by beat (one insert per tick), pruned past each resolution's retention.
    """

    resolution_s = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=RollupKind.choices)
    subject = models.CharField(max_length=120)
    bucket = models.DateTimeField(help_text="Start of the bucket (UTC).")
    values = models.JSONField(default=dict)

    class Meta:
        constraints = [
            # Also the read path: one subject's buckets at one resolution, in time order.
            models.UniqueConstraint(
                fields=["kind", "subject", "resolution_s", "bucket"], name="rollup_subject_bucket"
            )
        ]
        indexes = [models.Index(fields=["resolution_s", "bucket"], name="rollup_resolution_bucket")]

    def __str__(self) -> str:
        return f"{self.kind}:{self.subject} {self.resolution_s}s {self.bucket:%Y-%m-%d %H:%M:%S}"


class HistoryProgress(models.Model):
    """How far a coarser bucket's points have been written: they are written a slice a run (PostgreSQL).

    A minute's 1 min points at 1,000 hosts unnest 78,000 10 s points (215-365 ms in one run), an hour's
    1 h points 780,000 minute points and combine 13,200 request points (2.4-4.7 s). So beat writes them
    a slice a run (routing/rollups/services.py, `aggregate_slice`): first the hosts' GPU and engine rows,
    a range of host names at a time (so a host that left the inventory meanwhile still falls in one),
    then the pools' and tenants' rows (a minute's at once, an hour's a few subjects at a time). `phase`
    and `after` (the last host name, or `<kind>:<subject>`, written) say where the next slice starts;
    `done` once the last one is in. Each slice's points and this row are written in one transaction,
    so a slice is written once."""

    class Phase(models.TextChoices):
        HOSTS = "hosts"
        REQUESTS = "requests"

    resolution_s = models.PositiveIntegerField()
    bucket = models.DateTimeField(help_text="Start of the bucket (UTC).")
    phase = models.CharField(max_length=8, choices=Phase.choices, default=Phase.HOSTS)
    after = models.CharField(max_length=200, blank=True, default="")
    done = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["resolution_s", "bucket"], name="history_progress_bucket")
        ]

    def __str__(self) -> str:
        return f"{self.resolution_s}s {self.bucket:%Y-%m-%d %H:%M} {self.phase} after {self.after!r}"


class StageChain(models.Model):
    """A policy's chain of stages around generation, for one alias, one tenant, or both.

    `stages` is the JSON form checked by routing/proxy/stagespec.py: optional pre-stages, exactly one
    `generate` step, optional post-stages. A request takes the most specific enabled chain: its tenant's
    for its alias, then its tenant's for any alias, then its alias's. A chain with neither alias nor
    tenant applies to nothing by itself; other chains include it. Each save is a new `version`, kept
    in StageChainVersion.
    """

    name = models.CharField(max_length=100, unique=True)
    alias = models.CharField(max_length=100, blank=True, default="")
    tenant = models.ForeignKey(
        "console.Tenant", null=True, blank=True, on_delete=models.CASCADE, related_name="stage_chains"
    )
    stages = models.JSONField(default=list)
    enabled = models.BooleanField(default=True)
    version = models.PositiveIntegerField(default=1)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class StageChainVersion(models.Model):
    """One saved version of a StageChain: its stages as they were, who saved them and when."""

    chain = models.ForeignKey(StageChain, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    stages = models.JSONField(default=list)
    alias = models.CharField(max_length=100, blank=True, default="")
    tenant_id = models.BigIntegerField(null=True, blank=True)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["chain", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["chain", "version"], name="stage_chain_version_unique")
        ]

    def __str__(self) -> str:
        return f"{self.chain_id} v{self.version}"
