"""Node hosts, their GPUs, deployments of model versions onto them, and each deployment's history."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from core.celery import node_queue
from nodes import agent_generation
from nodes.choices import DeploymentState, DesiredState, Engine, HostState, MultiHostBackend

HOST_NAME_VALIDATOR = RegexValidator(
    r"^[a-z0-9][a-z0-9\-]{0,62}$",
    "Use lowercase letters, digits and hyphens (it becomes a queue and a group name).",
)


class DeploymentQuerySet(models.QuerySet["Deployment", "Deployment"]):
    def update(self, **kwargs: object) -> int:
        # Every bulk write of deployments (desired state, restart count, start token) reaches their
        # hosts' agents at the next sync: their generations move (nodes/agent_generation.py).
        agent_generation.bump(self.values_list("host__name", flat=True))
        return super().update(**kwargs)


class Host(models.Model):
    """A machine that runs a node agent and inference engines.

    Its GPUs are reported by the agent (never typed in by hand); `last_heartbeat`
    is written by the agent every NODE_HEARTBEAT_SECONDS.
    """

    name = models.CharField(max_length=63, unique=True, validators=[HOST_NAME_VALIDATOR])
    # Where the proxy reaches this host's engines (IP or DNS name, no scheme, no port).
    address = models.CharField(max_length=255, default="127.0.0.1")
    # Pool/role label: long-context, high-throughput, cpu-postprocess, or free-form.
    role = models.CharField(max_length=64, blank=True, default="")
    labels = models.JSONField(default=dict, blank=True)
    cost_per_hour = models.DecimalField(max_digits=10, decimal_places=4, default=Decimal("0"))
    state = models.CharField(max_length=16, choices=HostState.choices, default=HostState.UNKNOWN)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    # What the agent says about itself: version, pid, whether NVML works and why not.
    agent_info = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def agent_queue(self) -> str:
        return node_queue(self.name)


class Gpu(models.Model):
    """One GPU of a host, as the agent last reported it (NVML, or a simulated GPU marked so)."""

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=100, blank=True, default="")
    name = models.CharField(max_length=200, blank=True, default="")
    memory_total_bytes = models.PositiveBigIntegerField(default=0)
    simulated = models.BooleanField(default=False)
    last_seen = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["host__name", "index"]
        constraints = [models.UniqueConstraint(fields=["host", "index"], name="gpu_unique_host_index")]

    def __str__(self) -> str:
        return f"{self.host.name}:gpu{self.index} {self.name}"


class Deployment(models.Model):
    """A model version served by one engine process on one host, with its engine parameters.

    `desired_state` is what an admin asked for; `state` is what the agent observed. The engine's
    API key is never stored: it is derived from `id` and `start_token` (see lifecycle.engine_api_key),
    and `start_token` changes at every launch.
    """

    name = models.CharField(max_length=100, unique=True)
    model_version = models.ForeignKey(
        "models_registry.ModelVersion", on_delete=models.PROTECT, related_name="deployments"
    )
    quantization = models.ForeignKey(
        "models_registry.QuantizationConfig",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="deployments",
    )
    engine = models.CharField(max_length=16, choices=Engine.choices, default=Engine.VLLM)
    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="deployments")
    gpu_indices = models.JSONField(default=list, blank=True)
    # Engine parameters (vLLM names; the llama.cpp adapter maps what applies). Null means "vLLM's
    # default": the flag is omitted and vLLM picks the value (docs/deploying.md, "vLLM's defaults").
    gpu_memory_utilization = models.FloatField(
        null=True, blank=True, default=None, validators=[MinValueValidator(0.01), MaxValueValidator(1.0)]
    )
    max_model_len = models.PositiveIntegerField(default=4096)
    block_size = models.PositiveIntegerField(null=True, blank=True, default=None)
    max_num_seqs = models.PositiveIntegerField(null=True, blank=True, default=None)
    max_num_batched_tokens = models.PositiveIntegerField(null=True, blank=True)
    tensor_parallel_size = models.PositiveSmallIntegerField(default=1)
    pipeline_parallel_size = models.PositiveSmallIntegerField(default=1)
    # The Ray head's port (GCS) on `host` when the deployment spans hosts (DeploymentMember rows); null
    # means Ray's default, 6379. Unused by a deployment on one host.
    ray_port = models.PositiveIntegerField(
        null=True, blank=True, default=None, validators=[MinValueValidator(1024), MaxValueValidator(65535)]
    )
    # How the hosts of a deployment that spans hosts work together: Ray (a cluster the agents start
    # first) or vLLM's multiprocessing executor (each host runs `vllm serve`, see MultiHostBackend).
    multi_host_backend = models.CharField(
        max_length=8, choices=MultiHostBackend.choices, default=MultiHostBackend.RAY
    )
    # With the mp backend: the port on `host` where every host's workers meet (vLLM's --master-port);
    # null means vLLM's default, 29501.
    master_port = models.PositiveIntegerField(
        null=True, blank=True, default=None, validators=[MinValueValidator(1024), MaxValueValidator(65535)]
    )
    # A `--quantization` value the admin forces; blank lets vLLM read the checkpoint's
    # quantization_config, so AWQ/GPTQ checkpoints get Marlin kernels where the GPU allows.
    quantization_override = models.CharField(max_length=32, blank=True, default="")
    # The quantization kernel the engine said it uses at its last start ("" when it said none).
    reported_quantization = models.CharField(max_length=64, blank=True, default="")
    enable_prefix_caching = models.BooleanField(default=True)
    # Sleep mode (vLLM's --enable-sleep-mode, dev endpoints for the agent): set when sleep is configured
    # here or on a pool serving it; an engine running without it is restarted to get it.
    sleep_enabled = models.BooleanField(default=False)
    # Put the engine to sleep after this many seconds with no request running or waiting (null: never
    # on its own; a pool's setting may still apply), at this level (1: weights to host memory, 2: drop).
    sleep_idle_seconds = models.PositiveIntegerField(null=True, blank=True, default=None)
    sleep_level = models.PositiveSmallIntegerField(default=1)
    # The level it sleeps at now (0 while awake), as the agent confirmed with /is_sleeping.
    sleeping_level = models.PositiveSmallIntegerField(default=0)
    extra_args = models.JSONField(default=list, blank=True)
    port = models.PositiveIntegerField(validators=[MinValueValidator(1024), MaxValueValidator(65535)])
    # The name tenants send as "model" (the ModelAlias name); the engine serves under it.
    served_model_name = models.CharField(max_length=200)
    # Routing role label, e.g. long-context or high-throughput.
    role = models.CharField(max_length=64, blank=True, default="")
    desired_state = models.CharField(
        max_length=16, choices=DesiredState.choices, default=DesiredState.RUNNING
    )
    state = models.CharField(max_length=16, choices=DeploymentState.choices, default=DeploymentState.PENDING)
    state_reason = models.TextField(blank=True, default="")
    state_changed_at = models.DateTimeField(null=True, blank=True)
    start_token = models.CharField(max_length=64, blank=True, default="")
    # The running engine process as the agent last saw it.
    pid = models.PositiveIntegerField(null=True, blank=True)
    launch_argv = models.JSONField(default=list, blank=True)
    log_path = models.CharField(max_length=500, blank=True, default="")
    started_at = models.DateTimeField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    # Consecutive restarts that did not stay up; reset after the engine has been ready for a while.
    restart_count = models.PositiveIntegerField(default=0)
    # Every restart after a crash in the deployment's life; never reset, so a flapping engine shows.
    restarts_total = models.PositiveIntegerField(default=0)
    next_restart_at = models.DateTimeField(null=True, blank=True)
    last_log_lines = models.TextField(blank=True, default="")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = models.Manager.from_queryset(DeploymentQuerySet)()

    class Meta:
        ordering = ["host__name", "port"]
        indexes = [models.Index(fields=["host", "state"])]

    def __str__(self) -> str:
        return self.name

    @property
    def base_url(self) -> str:
        return f"http://{self.host.address}:{self.port}"

    @property
    def ray_head_address(self) -> str:
        return f"{self.host.address}:{self.ray_port or DEFAULT_RAY_PORT}"

    @property
    def spans_hosts_with_mp(self) -> bool:
        """Whether its hosts run vLLM's multiprocessing executor (no Ray); meaningful with members."""
        return self.multi_host_backend == MultiHostBackend.MP


# Ray's own default GCS port (`ray start --head` without --port).
DEFAULT_RAY_PORT = 6379
# vLLM's default --master-port (vllm/config/parallel.py:273).
DEFAULT_MASTER_PORT = 29501


class DeploymentMember(models.Model):
    """A further host of a deployment that spans hosts: pipeline stage `stage` (1..PP-1) runs there.

    The deployment's own `host` and `gpu_indices` are stage 0, where the engine's API server runs; each
    member host gives its `gpu_indices` (tensor_parallel_size of them) and holds 1/PP of the layers and
    of the KV cache. With Ray it joins the head's Ray cluster as a worker node; with the mp backend it
    runs `vllm serve --headless --node-rank <stage>` (Deployment.multi_host_backend).
    """

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="members")
    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="deployment_memberships")
    stage = models.PositiveSmallIntegerField(validators=[MinValueValidator(1)])
    gpu_indices = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["deployment_id", "stage"]
        constraints = [
            models.UniqueConstraint(fields=["deployment", "stage"], name="member_unique_stage"),
            models.UniqueConstraint(fields=["deployment", "host"], name="member_unique_host"),
        ]

    def __str__(self) -> str:
        return f"{self.deployment_id} stage {self.stage} on {self.host_id}"


class DeploymentEvent(models.Model):
    """One step in a deployment's history: a state change, an action, or a refusal, with why."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    from_state = models.CharField(max_length=16, blank=True, default="")
    to_state = models.CharField(max_length=16, blank=True, default="")
    message = models.TextField(blank=True, default="")
    # The engine's last log lines, attached when it exited or failed.
    log_tail = models.TextField(blank=True, default="")
    # On the event of each launch: what was run and on what (see nodes/agent/services.launch_record).
    launch = models.JSONField(null=True, blank=True, default=None)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.deployment_id}: {self.from_state} -> {self.to_state}"


class PerformanceBaseline(models.Model):
    """A load test of a deployment (`inferchain bench`) kept as what its normal speed looks like.

    `levels` holds one row per load level (see nodes/baselines.py for the shape); the deployment page
    draws them and compares the engine's live latency at its current load against them.
    """

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="baselines")
    name = models.CharField(max_length=120)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    target = models.CharField(max_length=300, blank=True, default="")
    model = models.CharField(max_length=200, blank=True, default="")
    mode = models.CharField(max_length=8)  # "closed" (clients) or "open" (requests/s)
    slo_ttft_s = models.FloatField()
    slo_itl_s = models.FloatField()
    knee_index = models.IntegerField(null=True, blank=True)
    levels = models.JSONField()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.deployment_id}: {self.name}"


class AgentToken(models.Model):
    """The credential one host's agent presents on /api/agent/: only a keyed hash and a visible prefix.

    Created when the host is registered (shown once), rotated or revoked from the console. A rotated
    token is revoked, not deleted, so an agent still using it is told "revoked", not "unknown".
    """

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="agent_tokens")
    prefix = models.CharField(max_length=16)
    hashed_token = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.host.name}: {self.prefix}…"
