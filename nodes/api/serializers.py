"""Serializers of hosts, GPUs, deployments and their history, with live values from Redis."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.api.base import StrictModelSerializer, StrictSerializerMixin
from models_registry.api.serializers import FitResultSerializer, StepSerializer
from models_registry.models import ModelVersion, QuantizationConfig
from nodes import baselines, fleet_summary
from nodes.choices import ACTIVE_STATES, DeploymentState, Engine, MultiHostBackend
from nodes.lifecycle import host_is_reachable, live_deployment_key, live_gpu_key, read_live
from nodes.models import (
    AgentToken,
    Deployment,
    DeploymentEvent,
    DeploymentMember,
    Gpu,
    Host,
    PerformanceBaseline,
)
from nodes.preflight import held_fraction, preflight
from nodes.services import sleep_problems
from nodes.spec import DeploySpec

# JSON columns, validated by hand below, described by their real shape in the OpenAPI schema.


@extend_schema_field(serializers.ListField(child=serializers.IntegerField(min_value=0)))
class GpuIndicesField(serializers.JSONField):
    pass


@extend_schema_field(serializers.ListField(child=serializers.CharField()))
class StringListField(serializers.JSONField):
    pass


@extend_schema_field(serializers.DictField(child=serializers.CharField()))
class LabelsField(serializers.JSONField):
    pass


class AgentInfoSerializer(serializers.Serializer):
    """What a host's agent says about itself at each heartbeat (empty until its first one)."""

    pid = serializers.IntegerField(required=False)
    nvml = serializers.BooleanField(required=False, help_text="NVML (real NVIDIA GPUs) is available.")
    gpu_note = serializers.CharField(required=False, help_text="Why there is no NVML, when there is none.")
    simulated_gpus = serializers.BooleanField(required=False)
    heartbeat_seconds = serializers.FloatField(required=False)


@extend_schema_field(AgentInfoSerializer)
class AgentInfoField(serializers.JSONField):
    pass


class GpuSampleSerializer(serializers.Serializer):
    """One GPU sample as the agent publishes it each tick (live value and `host.telemetry` events)."""

    index = serializers.IntegerField()
    ts = serializers.FloatField(help_text="Sample time, unix seconds.")
    simulated = serializers.BooleanField()
    utilization_pct = serializers.FloatField()
    memory_used_bytes = serializers.IntegerField()
    memory_total_bytes = serializers.IntegerField()
    temperature_c = serializers.FloatField()
    power_watts = serializers.FloatField(allow_null=True)


class EngineLiveSerializer(serializers.Serializer):
    """One engine's live record as the agent publishes it each tick (see docs/nodes.md, Live data)."""

    ts = serializers.FloatField(help_text="Sample time, unix seconds.")
    deployment_id = serializers.IntegerField()
    host = serializers.CharField()
    name = serializers.CharField()
    served_model_name = serializers.CharField()
    engine = serializers.ChoiceField(choices=Engine.choices)
    state = serializers.ChoiceField(choices=DeploymentState.choices)
    alive = serializers.BooleanField()
    ready = serializers.BooleanField()
    num_requests_running = serializers.FloatField()
    num_requests_waiting = serializers.FloatField()
    kv_cache_usage_perc = serializers.FloatField(help_text="A 0..1 fraction, as vLLM reports it.")
    num_gpu_blocks = serializers.IntegerField(allow_null=True)
    block_size = serializers.IntegerField()
    kv_cache_total_tokens = serializers.IntegerField(allow_null=True)
    prompt_tokens_total = serializers.FloatField()
    generation_tokens_total = serializers.FloatField()
    prefix_cache_queries_total = serializers.FloatField()
    prefix_cache_hits_total = serializers.FloatField()
    tokens_per_s = serializers.FloatField(help_text="Generated tokens per second over the last 10 s.")
    ttft_p50_s = serializers.FloatField(allow_null=True)
    itl_p50_s = serializers.FloatField(allow_null=True)
    ttft_p95_s = serializers.FloatField(allow_null=True)
    itl_p95_s = serializers.FloatField(allow_null=True)
    has_metrics = serializers.BooleanField()
    idle_since = serializers.FloatField(
        required=False, allow_null=True, help_text="Unix time of the last request running or waiting."
    )
    sleeping_level = serializers.IntegerField(required=False, help_text="0 awake; 1 or 2 asleep.")


class GpuSerializer(serializers.ModelSerializer):
    live = serializers.SerializerMethodField()

    class Meta:
        model = Gpu
        fields = ["id", "index", "uuid", "name", "memory_total_bytes", "simulated", "last_seen", "live"]
        read_only_fields = fields

    @extend_schema_field(GpuSampleSerializer(allow_null=True))
    def get_live(self, obj: Gpu) -> dict[str, Any] | None:
        redis_key = live_gpu_key(obj.host.name, obj.index)
        prefetched = self.context.get("live")
        return prefetched.get(redis_key) if prefetched is not None else read_live(redis_key)


class AgentTokenInfoSerializer(serializers.ModelSerializer):
    class Meta:
        model = AgentToken
        fields = ["prefix", "created_at", "last_used_at"]
        read_only_fields = fields


class HostSerializer(StrictModelSerializer):
    """A host; GPUs, heartbeat and state come from its agent and are read-only here."""

    gpus = GpuSerializer(many=True, read_only=True)
    labels = LabelsField(required=False)
    agent_info = AgentInfoField(read_only=True)
    reachable = serializers.SerializerMethodField()
    agent_queue = serializers.CharField(read_only=True)
    deployment_count = serializers.SerializerMethodField()
    agent_token = serializers.SerializerMethodField()
    new_agent_token = serializers.SerializerMethodField()

    class Meta:
        model = Host
        fields = [
            "id",
            "name",
            "address",
            "role",
            "labels",
            "cost_per_hour",
            "state",
            "reachable",
            "last_heartbeat",
            "agent_info",
            "agent_queue",
            "gpus",
            "deployment_count",
            "agent_token",
            "new_agent_token",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["state", "last_heartbeat", "agent_info", "created_at", "updated_at"]

    @extend_schema_field(AgentTokenInfoSerializer(allow_null=True))
    def get_agent_token(self, obj: Host) -> dict[str, Any] | None:
        """The host's active agent token (prefix and dates only; the token itself is never shown again)."""
        active = [t for t in obj.agent_tokens.all() if t.revoked_at is None]
        return AgentTokenInfoSerializer(active[0]).data if active else None

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_new_agent_token(self, obj: Host) -> str | None:
        """The token just issued (on create and rotate only): shown once, stored hashed."""
        return self.context.get("new_agent_token")

    def get_reachable(self, obj: Host) -> bool:
        return host_is_reachable(obj)

    def get_deployment_count(self, obj: Host) -> int:
        return sum(1 for d in obj.deployments.all() if d.state in ACTIVE_STATES)

    def validate_labels(self, value: Any) -> Any:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise serializers.ValidationError("Labels are a JSON object of string keys.")
        return value


class LaunchRecordSerializer(serializers.Serializer):
    """What one launch ran, on what (kept on that launch's event; see docs/deploying.md)."""

    engine = serializers.CharField()
    engine_version = serializers.CharField(
        allow_null=True,
        default=None,
        help_text="The engine's own version as the host reported it: vLLM's, llama-cpp-python's for "
        "llama.cpp, the simulator's; null when not reported (and on records from before it was kept).",
    )
    vllm_version = serializers.CharField(
        allow_null=True, help_text="The host's vLLM, as it reported it (whatever the engine kind)."
    )
    driver_version = serializers.CharField(allow_null=True, help_text="NVIDIA driver (NVML); null if none.")
    cuda_driver_version = serializers.CharField(allow_null=True, help_text="CUDA the driver supports (NVML).")
    simulated = serializers.BooleanField(help_text="The engine or its GPUs are simulated: not a real stack.")
    simulated_engine = serializers.BooleanField()
    simulated_gpus = serializers.BooleanField()
    manifest_digest = serializers.CharField(allow_blank=True)
    model_version = serializers.CharField()
    env = serializers.DictField(child=serializers.CharField(), help_text="Secret-looking values redacted.")
    argv = serializers.ListField(child=serializers.CharField(), help_text="The engine key redacted.")


class DeploymentEventSerializer(serializers.ModelSerializer):
    launch = LaunchRecordSerializer(read_only=True, allow_null=True)

    class Meta:
        model = DeploymentEvent
        fields = ["id", "at", "from_state", "to_state", "message", "log_tail", "launch"]
        read_only_fields = fields


ENGINE_PARAMS = [
    "gpu_indices",
    "gpu_memory_utilization",
    "max_model_len",
    "block_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "enable_prefix_caching",
    "extra_args",
    "quantization_override",
    "port",
    "ray_port",
    "multi_host_backend",
    "master_port",
]


SLEEP_PARAMS = ["sleep_enabled", "sleep_idle_seconds", "sleep_level"]


class DeploymentMemberSerializer(serializers.Serializer):
    """A further host of a deployment that spans hosts: one pipeline stage, tensor_parallel_size GPUs."""

    host = serializers.PrimaryKeyRelatedField(queryset=Host.objects.all())
    host_name = serializers.CharField(source="host.name", read_only=True)
    stage = serializers.IntegerField(read_only=True)
    gpu_indices = serializers.ListField(child=serializers.IntegerField(min_value=0), default=list)


MEMBERS_HELP = (
    "Further hosts, in pipeline-stage order after `host` (stage 0, where the API server runs): the "
    "deployment spans hosts with tensor parallel inside each and pipeline parallel across them "
    "(pipeline_parallel_size = 1 + members), on a Ray cluster or with vLLM's multiprocessing executor "
    "(multi_host_backend). Empty: one host."
)
BACKEND_HELP = (
    "How the hosts of a deployment that spans hosts run together: `ray` (each host's agent starts a "
    "Ray node, vLLM places its workers on the cluster) or `mp` (no Ray: the head runs `vllm serve "
    "--nnodes N --node-rank 0`, every member host `vllm serve --headless --node-rank R`, and their "
    "workers meet at the head's master_port). Unused on one host."
)
MASTER_PORT_HELP = (
    "With multi_host_backend mp: the port on `host` where every host's workers meet (null: 29501)."
)


class DeploymentSerializer(StrictModelSerializer):
    """A deployment. Creating one runs every pre-launch check; refusals are field errors (400)."""

    members = DeploymentMemberSerializer(many=True, required=False, help_text=MEMBERS_HELP)

    host_name = serializers.CharField(source="host.name", read_only=True)
    model_version_label = serializers.CharField(source="model_version.__str__", read_only=True)
    base_url = serializers.CharField(read_only=True)
    gpu_indices = GpuIndicesField(required=False)
    extra_args = StringListField(required=False)
    launch_argv = StringListField(read_only=True)
    live = serializers.SerializerMethodField()
    fit = serializers.SerializerMethodField()
    freed_memory_bytes = serializers.SerializerMethodField()

    class Meta:
        model = Deployment
        fields = [
            "id",
            "name",
            "model_version",
            "model_version_label",
            "quantization",
            "engine",
            "host",
            "host_name",
            "members",
            *ENGINE_PARAMS,
            "served_model_name",
            "role",
            *SLEEP_PARAMS,
            "sleeping_level",
            "freed_memory_bytes",
            "desired_state",
            "state",
            "state_reason",
            "state_changed_at",
            "pid",
            "launch_argv",
            "reported_quantization",
            "started_at",
            "ready_at",
            "restart_count",
            "restarts_total",
            "next_restart_at",
            "last_log_lines",
            "base_url",
            "live",
            "fit",
            "created_at",
            "updated_at",
        ]
        read_only_fields = [
            "sleeping_level",
            "desired_state",
            "state",
            "state_reason",
            "state_changed_at",
            "pid",
            "launch_argv",
            "reported_quantization",
            "started_at",
            "ready_at",
            "restart_count",
            "restarts_total",
            "next_restart_at",
            "last_log_lines",
            "created_at",
            "updated_at",
        ]
        extra_kwargs = {
            "gpu_memory_utilization": {"help_text": "Null: vLLM's default (0.92), flag omitted."},
            "block_size": {"help_text": "Null: vLLM's default (the attention backend's size), flag omitted."},
            "max_num_seqs": {"help_text": "Null: vLLM's default for the GPU (get_batch_defaults)."},
            "max_num_batched_tokens": {"help_text": "Null: vLLM's default for the GPU (get_batch_defaults)."},
            "quantization_override": {
                "help_text": "A --quantization method to force; blank lets vLLM read the checkpoint's "
                "quantization_config (Marlin kernels for AWQ/GPTQ)."
            },
            "reported_quantization": {
                "help_text": "The quantization kernel the engine logged at its last start ('' if none)."
            },
            "sleep_enabled": {
                "help_text": "Launch with vLLM's sleep mode so the agent can sleep and wake the engine "
                "(implied by sleep_idle_seconds)."
            },
            "sleep_idle_seconds": {
                "help_text": "Sleep after this many seconds with no request running or waiting; null: never."
            },
            "sleep_level": {"help_text": "1: weights to host memory, KV cache freed; 2: both dropped."},
            "sleeping_level": {"help_text": "The level the engine sleeps at now; 0 while awake."},
            "ray_port": {
                "help_text": "The Ray head's port on `host` when the deployment spans hosts (null: 6379)."
            },
            "multi_host_backend": {"help_text": BACKEND_HELP},
            "master_port": {"help_text": MASTER_PORT_HELP},
        }

    def create(self, validated_data: dict[str, Any]) -> Deployment:
        members = validated_data.pop("members", [])
        deployment = super().create(validated_data)
        _save_members(deployment, members)
        return deployment

    def update(self, instance: Deployment, validated_data: dict[str, Any]) -> Deployment:
        members = validated_data.pop("members", None)
        deployment = super().update(instance, validated_data)
        if members is not None:
            _save_members(deployment, members)
        return deployment

    @extend_schema_field(EngineLiveSerializer(allow_null=True))
    def get_live(self, obj: Deployment) -> dict[str, Any] | None:
        redis_key = live_deployment_key(obj.pk)
        prefetched = self.context.get("live")
        return prefetched.get(redis_key) if prefetched is not None else read_live(redis_key)

    @extend_schema_field(
        serializers.IntegerField(
            allow_null=True,
            help_text="While asleep: GPU memory given back, summed over its GPUs, as the fit check counts it "
            "(its reservation awake minus what sleep mode leaves); null while awake.",
        )
    )
    def get_freed_memory_bytes(self, obj: Deployment) -> int | None:
        if obj.state != DeploymentState.SLEEPING:
            return None
        gpus = Gpu.objects.filter(host_id=obj.host_id, index__in=obj.gpu_indices or [])
        awake = Deployment(gpu_memory_utilization=obj.gpu_memory_utilization, state=DeploymentState.READY)
        return sum(
            round(
                (held_fraction(awake, g.memory_total_bytes) - held_fraction(obj, g.memory_total_bytes))
                * g.memory_total_bytes
            )
            for g in gpus
        )

    @extend_schema_field(FitResultSerializer(allow_null=True, help_text="The fit check of the last save."))
    def get_fit(self, obj: Deployment) -> dict[str, Any] | None:
        return getattr(self, "_fit", None)

    def validate(self, attrs: Any) -> Any:
        attrs = super().validate(attrs)
        instance: Deployment | None = self.instance
        self._validate_sleep(attrs, instance)
        if instance is not None and instance.state in ACTIVE_STATES:
            # Sleep timing is control, not an engine parameter; sleep mode itself is (a flag at launch).
            changed = [k for k in attrs if k not in ("name", "role", "sleep_idle_seconds", "sleep_level")]
            if changed:
                raise serializers.ValidationError(
                    {k: ["Stop the deployment before changing its engine parameters."] for k in changed}
                )

        extra_args = attrs.get("extra_args", [])
        if not isinstance(extra_args, list) or not all(isinstance(a, str) for a in extra_args):
            raise serializers.ValidationError({"extra_args": ["Must be a list of strings."]})
        gpu_indices = attrs.get("gpu_indices", [])
        if not isinstance(gpu_indices, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in gpu_indices
        ):
            raise serializers.ValidationError({"gpu_indices": ["A list of GPU indices (integers >= 0)."]})
        spec = DeploySpec.from_values(attrs, instance)
        # The row stores what was checked, the tensor- and pipeline-parallel defaults included.
        attrs["tensor_parallel_size"] = spec.tensor_parallel_size
        attrs["pipeline_parallel_size"] = spec.pipeline_parallel_size
        check = preflight(spec, exclude_id=instance.pk if instance is not None else None)
        self._fit = FitResultSerializer(check.fit).data if check.fit is not None else None
        if not check.ok:
            raise serializers.ValidationError(check.errors)
        return attrs

    def _validate_sleep(self, attrs: Any, instance: Deployment | None) -> None:
        """Sleep needs an engine with sleep mode and a level of 1 or 2; idle sleep implies sleep mode."""

        def value(name: str) -> Any:
            if name in attrs:
                return attrs[name]
            return (
                getattr(instance, name)
                if instance is not None
                else getattr(Deployment._meta.get_field(name), "default", None)
            )

        if attrs.get("sleep_idle_seconds") is not None:
            if instance is not None and instance.state in ACTIVE_STATES and not instance.sleep_enabled:
                raise serializers.ValidationError(
                    {
                        "sleep_idle_seconds": [
                            "This engine runs without sleep mode: stop it, then enable sleep."
                        ]
                    }
                )
            attrs["sleep_enabled"] = True
        level = value("sleep_level")
        engine = value("engine")
        wanted = bool(value("sleep_enabled")) or value("sleep_idle_seconds") is not None
        problems = sleep_problems(engine, level)
        errors = {}
        if "sleep_level" in problems:
            errors["sleep_level"] = [problems["sleep_level"]]
        if wanted and "engine" in problems:
            errors["sleep_enabled" if "sleep_idle_seconds" not in attrs else "sleep_idle_seconds"] = [
                problems["engine"]
            ]
        if errors:
            raise serializers.ValidationError(errors)


def _save_members(deployment: Deployment, members: list[dict[str, Any]]) -> None:
    """The member hosts as checked, in stage order (stage 1 first)."""
    deployment.members.all().delete()
    DeploymentMember.objects.bulk_create(
        DeploymentMember(
            deployment=deployment, host=m["host"], stage=stage, gpu_indices=list(m.get("gpu_indices") or [])
        )
        for stage, m in enumerate(members, start=1)
    )


class PreflightSerializer(StrictSerializerMixin, serializers.Serializer):
    """The deploy wizard's "check before launch": the same checks as create, nothing saved."""

    model_version = serializers.PrimaryKeyRelatedField(queryset=ModelVersion.objects.all())
    quantization = serializers.PrimaryKeyRelatedField(
        queryset=QuantizationConfig.objects.all(), required=False, allow_null=True
    )
    engine = serializers.ChoiceField(choices=Engine.choices, default=Engine.VLLM)
    host = serializers.PrimaryKeyRelatedField(queryset=Host.objects.all())
    gpu_indices = serializers.ListField(child=serializers.IntegerField(min_value=0), default=list)
    # Null or omitted: vLLM's default (the flag is not passed).
    gpu_memory_utilization = serializers.FloatField(required=False, allow_null=True, default=None)
    max_model_len = serializers.IntegerField(default=4096, min_value=1)
    block_size = serializers.IntegerField(required=False, allow_null=True, default=None)
    max_num_seqs = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=1)
    max_num_batched_tokens = serializers.IntegerField(required=False, allow_null=True, min_value=1)
    tensor_parallel_size = serializers.IntegerField(required=False, min_value=1)
    # Omitted: 1, or one stage per host when `members` are given.
    pipeline_parallel_size = serializers.IntegerField(required=False, min_value=1)
    enable_prefix_caching = serializers.BooleanField(default=True)
    extra_args = serializers.ListField(child=serializers.CharField(), default=list)
    quantization_override = serializers.CharField(required=False, allow_blank=True, default="")
    port = serializers.IntegerField(min_value=1024, max_value=65535)
    members = DeploymentMemberSerializer(many=True, required=False, default=list, help_text=MEMBERS_HELP)
    ray_port = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=1024)
    multi_host_backend = serializers.ChoiceField(
        choices=MultiHostBackend.choices, default=MultiHostBackend.RAY, help_text=BACKEND_HELP
    )
    master_port = serializers.IntegerField(
        required=False,
        allow_null=True,
        default=None,
        min_value=1024,
        max_value=65535,
        help_text=MASTER_PORT_HELP,
    )


class StopSerializer(StrictSerializerMixin, serializers.Serializer):
    drain = serializers.BooleanField(default=False)


class SleepSerializer(StrictSerializerMixin, serializers.Serializer):
    level = serializers.IntegerField(
        required=False,
        allow_null=True,
        default=None,
        help_text="1 or 2; default: the deployment's sleep_level.",
    )


class PreflightResultSerializer(serializers.Serializer):
    """What create would say, without creating: field errors (empty when ok) and the fit check."""

    ok = serializers.BooleanField()
    # DRF's metaclass takes declared fields off the class, so `errors` does not shadow Serializer.errors.
    errors = serializers.DictField(  # type: ignore[assignment]
        child=serializers.ListField(child=serializers.CharField())
    )
    fit = FitResultSerializer(allow_null=True)


class DeploymentLogSerializer(serializers.Serializer):
    source = serializers.ChoiceField(  # type: ignore[assignment]
        choices=[
            ("file", "the engine's log file"),
            ("agent", "the engine's log file, read by the host's agent"),
            ("last_exit", "the lines kept at its last exit"),
        ]
    )
    path = serializers.CharField()
    lines = serializers.ListField(child=serializers.CharField())


class HistoryQuerySerializer(StrictSerializerMixin, serializers.Serializer):
    minutes = serializers.IntegerField(min_value=1, max_value=60, default=60)
    host = serializers.CharField(required=False, help_text="Only this host's GPUs and deployments.")
    deployment = serializers.IntegerField(
        required=False, help_text="Only this deployment and the GPUs it runs on."
    )


class GpuHistorySerializer(serializers.Serializer):
    """One GPU's samples as columns: `t` and one value per sample in each list (null: no value)."""

    host = serializers.CharField()
    index = serializers.IntegerField()
    memory_total_bytes = serializers.IntegerField()
    simulated = serializers.BooleanField()
    t = serializers.ListField(child=serializers.FloatField(), help_text="Sample times, unix seconds.")
    utilization_pct = serializers.ListField(child=serializers.FloatField(allow_null=True))
    memory_used_bytes = serializers.ListField(child=serializers.FloatField(allow_null=True))
    temperature_c = serializers.ListField(child=serializers.FloatField(allow_null=True))
    power_watts = serializers.ListField(child=serializers.FloatField(allow_null=True))


class EngineHistorySerializer(serializers.Serializer):
    """One deployment's samples as columns (see GpuHistory)."""

    deployment_id = serializers.IntegerField()
    name = serializers.CharField()
    host = serializers.CharField()
    t = serializers.ListField(child=serializers.FloatField(), help_text="Sample times, unix seconds.")
    tokens_per_s = serializers.ListField(child=serializers.FloatField(allow_null=True))
    kv_cache_usage_perc = serializers.ListField(child=serializers.FloatField(allow_null=True))
    num_requests_running = serializers.ListField(child=serializers.FloatField(allow_null=True))
    num_requests_waiting = serializers.ListField(child=serializers.FloatField(allow_null=True))
    ttft_p50_s = serializers.ListField(child=serializers.FloatField(allow_null=True))
    itl_p50_s = serializers.ListField(child=serializers.FloatField(allow_null=True))


class TelemetryHistorySerializer(serializers.Serializer):
    minutes = serializers.IntegerField()
    gpus = GpuHistorySerializer(many=True)
    engines = EngineHistorySerializer(many=True)


class BaselineLevelSerializer(serializers.Serializer):
    """One load level of a baseline (nodes/baselines.py reads it from a bench report)."""

    clients = serializers.IntegerField(allow_null=True)
    rate = serializers.FloatField(allow_null=True)
    ok = serializers.IntegerField()
    error_count = serializers.IntegerField(help_text="Requests of the level that failed.")
    requests_per_s = serializers.FloatField()
    output_tokens_per_s = serializers.FloatField()
    goodput_requests_per_s = serializers.FloatField()
    ttft_p50_s = serializers.FloatField(allow_null=True)
    ttft_p95_s = serializers.FloatField(allow_null=True)
    ttft_p99_s = serializers.FloatField(allow_null=True)
    itl_p50_s = serializers.FloatField(allow_null=True)
    itl_p95_s = serializers.FloatField(allow_null=True)
    latency_p50_s = serializers.FloatField(allow_null=True)
    latency_p95_s = serializers.FloatField(allow_null=True)
    latency_p99_s = serializers.FloatField(allow_null=True)


class PerformanceBaselineSerializer(StrictModelSerializer):
    """A saved bench run; created from the report JSON `inferchain bench --out` writes."""

    report = serializers.JSONField(write_only=True, help_text="The JSON `inferchain bench --out FILE` wrote.")
    levels = BaselineLevelSerializer(many=True, read_only=True)
    created_by: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True
    )

    class Meta:
        model = PerformanceBaseline
        # Everything but what the admin sends (deployment, name, report) is read from the report.
        read_only_fields = [
            "created_at",
            "created_by",
            "target",
            "model",
            "mode",
            "slo_ttft_s",
            "slo_itl_s",
            "knee_index",
            "levels",
        ]
        fields = ["id", "deployment", "name", "report", *read_only_fields]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        report = attrs.pop("report", None)
        try:
            attrs.update(baselines.parse_report(report))
        except baselines.BaselineError as exc:
            raise serializers.ValidationError(exc.errors) from None
        return attrs


class BaselineCheckSerializer(serializers.Serializer):
    """The live engine against the deployment's newest baseline at the same load."""

    baseline_id = serializers.IntegerField(allow_null=True)
    load = serializers.FloatField(
        allow_null=True, help_text="Requests in flight at the engine (running + waiting)."
    )
    live_ttft_p95_s = serializers.FloatField(allow_null=True)
    expected_ttft_p95_s = serializers.FloatField(allow_null=True)
    ratio = serializers.FloatField(allow_null=True)
    status = serializers.ChoiceField(choices=["unknown", "within", "outside"])
    message = serializers.CharField()


class FleetSummaryQuerySerializer(StrictSerializerMixin, serializers.Serializer):
    top = serializers.IntegerField(
        min_value=1,
        max_value=fleet_summary.TOP_MAX,
        default=fleet_summary.TOP_DEFAULT,
        help_text="How many hosts down, busiest engines and hottest GPUs to name.",
    )


class CountsSerializer(serializers.Serializer):
    total = serializers.IntegerField()
    by_state = serializers.DictField(child=serializers.IntegerField())


class DownHostsSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    names = serializers.ListField(child=serializers.CharField(), help_text="The first `top`, by name.")


class HostCountsSerializer(CountsSerializer):
    down = DownHostsSerializer(help_text="Hosts not reachable: no heartbeat yet, or none for too long.")


class GpuCountsSerializer(serializers.Serializer):
    total = serializers.IntegerField()
    reporting = serializers.IntegerField(help_text="GPUs with a live sample.")


class PoolSummarySerializer(serializers.Serializer):
    """The engines serving one name, with their live records added up."""

    served_model_name = serializers.CharField()
    engines = serializers.IntegerField()
    ready = serializers.IntegerField()
    reporting = serializers.IntegerField(help_text="Engines with a live record.")
    running = serializers.IntegerField()
    waiting = serializers.IntegerField()
    tokens_per_s = serializers.FloatField()
    kv_cache_usage_mean = serializers.FloatField(
        allow_null=True, help_text="Over the engines that report a KV cache; null when none does."
    )
    kv_cache_usage_max = serializers.FloatField(allow_null=True)


class BusyEngineSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    served_model_name = serializers.CharField()
    host_name = serializers.CharField()
    state = serializers.CharField()
    kv_cache_usage_perc = serializers.FloatField(allow_null=True, help_text="Null: the engine reports none.")
    num_requests_running = serializers.IntegerField()
    num_requests_waiting = serializers.IntegerField()
    tokens_per_s = serializers.FloatField()
    has_metrics = serializers.BooleanField(
        help_text="The engine serves metrics (llama.cpp does not): without them its figures are not reported."
    )


class HotGpuSerializer(serializers.Serializer):
    host_name = serializers.CharField()
    index = serializers.IntegerField()
    name = serializers.CharField()
    utilization_pct = serializers.FloatField()
    temperature_c = serializers.FloatField(allow_null=True)
    memory_used_bytes = serializers.IntegerField()
    memory_total_bytes = serializers.IntegerField()


class FleetSummarySerializer(serializers.Serializer):
    hosts = HostCountsSerializer()
    deployments = CountsSerializer()
    gpus = GpuCountsSerializer()
    pools = PoolSummarySerializer(many=True)
    busiest_engines = BusyEngineSerializer(many=True, help_text="By KV cache usage, then requests waiting.")
    hottest_gpus = HotGpuSerializer(many=True, help_text="By utilization.")


class PlacementRequestSerializer(StrictSerializerMixin, serializers.Serializer):
    """The deploy wizard's placement help: where could this version run with these settings?"""

    model_version = serializers.PrimaryKeyRelatedField(
        queryset=ModelVersion.objects.all(),
        required=False,
        allow_null=True,
        default=None,
        help_text="Omitted: only the free memory per GPU comes back.",
    )
    quantization = serializers.PrimaryKeyRelatedField(
        queryset=QuantizationConfig.objects.all(), required=False, allow_null=True, default=None
    )
    engine = serializers.ChoiceField(choices=Engine.choices, default=Engine.VLLM)
    host = serializers.PrimaryKeyRelatedField(
        queryset=Host.objects.all(),
        required=False,
        allow_null=True,
        default=None,
        help_text="Omitted: every host is a candidate.",
    )
    gpu_indices = serializers.ListField(
        child=serializers.IntegerField(min_value=0),
        default=list,
        help_text="The GPUs picked so far (on `host`); empty: the verdict is on the proposed placement.",
    )
    gpu_memory_utilization = serializers.FloatField(
        min_value=0.01, max_value=1.0, required=False, allow_null=True, default=None
    )
    max_model_len = serializers.IntegerField(min_value=1, max_value=10_000_000, default=4096)
    max_num_seqs = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None)
    max_num_batched_tokens = serializers.IntegerField(
        min_value=1, required=False, allow_null=True, default=None
    )
    tensor_parallel_size = serializers.IntegerField(
        min_value=1,
        max_value=64,
        required=False,
        allow_null=True,
        default=None,
        help_text="Omitted: the number of GPUs picked, or as few as fit (1, 2, 4, 8) for the proposal.",
    )

    def validate(self, attrs: Any) -> Any:
        attrs = super().validate(attrs)
        if attrs["gpu_indices"] and attrs["host"] is None:
            raise serializers.ValidationError({"gpu_indices": ["Pick the host these GPUs are on."]})
        tp = attrs["tensor_parallel_size"]
        if tp is not None and attrs["gpu_indices"] and tp != len(attrs["gpu_indices"]):
            raise serializers.ValidationError(
                {
                    "tensor_parallel_size": [
                        f"tensor_parallel_size ({tp}) must equal the number of GPUs picked "
                        f"({len(attrs['gpu_indices'])}); vLLM runs one worker per GPU."
                    ]
                }
            )
        return attrs


class GpuHolderSerializer(serializers.Serializer):
    deployment = serializers.CharField(help_text="The deployment's name; '(asleep)' when it sleeps.")
    fraction = serializers.FloatField(help_text="The share of the GPU's memory it holds.")

    def to_representation(self, instance: Any) -> Any:
        name, share = instance
        return {"deployment": name, "fraction": share}


class GpuFreeSerializer(serializers.Serializer):
    """One GPU's memory as the fit check counts it: what other deployments reserve, what is left."""

    index = serializers.IntegerField()
    name = serializers.CharField()
    memory_total_bytes = serializers.IntegerField()
    reserved_fraction = serializers.FloatField()
    reserved_bytes = serializers.IntegerField()
    free_fraction = serializers.FloatField()
    free_bytes = serializers.IntegerField()
    holders = GpuHolderSerializer(many=True)


class HostFreeSerializer(serializers.Serializer):
    host = serializers.IntegerField(source="host.pk")
    host_name = serializers.CharField(source="host.name")
    usable = serializers.BooleanField(help_text="Reachable, not draining and with GPUs.")
    note = serializers.CharField(allow_blank=True, help_text="Why not usable ('' when it is).")
    gpus = GpuFreeSerializer(many=True)


class ProposedPlacementSerializer(serializers.Serializer):
    host = serializers.IntegerField(source="host.pk")
    host_name = serializers.CharField(source="host.name")
    gpu_indices = serializers.ListField(child=serializers.IntegerField())
    gpu_memory_utilization = serializers.FloatField(
        allow_null=True, help_text="The value to run with (null: vLLM's default)."
    )
    lowered_utilization = serializers.BooleanField(
        help_text="The utilization was lowered to the share other deployments leave on these GPUs."
    )
    reason = serializers.CharField(source="fit.reason")


class VerdictGpuSerializer(serializers.Serializer):
    index = serializers.IntegerField(source="gpu.index")
    name = serializers.CharField(source="gpu.name")
    memory_total_bytes = serializers.IntegerField(source="gpu.memory_total_bytes")
    free_bytes = serializers.IntegerField(source="gpu.free_bytes")
    reserved_fraction = serializers.FloatField(source="gpu.reserved_fraction")
    budget_bytes = serializers.IntegerField(
        help_text="GPU memory x gpu_memory_utilization: what vLLM claims."
    )
    ok = serializers.BooleanField(help_text="The budget fits in what others leave free.")


class VerdictSerializer(serializers.Serializer):
    fits = serializers.BooleanField()
    reason = serializers.CharField()
    host = serializers.IntegerField(source="host.pk")
    host_name = serializers.CharField(source="host.name")
    gpu_indices = serializers.ListField(child=serializers.IntegerField())
    gpu_memory_utilization = serializers.FloatField(help_text="The value used (vLLM's default when unset).")
    lines = StepSerializer(
        many=True, help_text="What the engine needs, in all and per GPU, against its budget."
    )
    gpus = VerdictGpuSerializer(many=True)
    fit = FitResultSerializer(help_text="The registry's fit check on these GPUs, every step.")


class PlacementChangesSerializer(serializers.Serializer):
    """The wizard fields an alternative sets; only the keys present change."""

    model_version = serializers.IntegerField(required=False)
    quantization = serializers.IntegerField(required=False, allow_null=True)
    host = serializers.IntegerField(required=False)
    gpu_indices = serializers.ListField(child=serializers.IntegerField(), required=False)
    gpu_memory_utilization = serializers.FloatField(required=False, allow_null=True)
    max_model_len = serializers.IntegerField(required=False)

    def to_representation(self, instance: Any) -> Any:
        # A nullable field would come back as null when absent; absent must stay absent ("no change").
        shown = super().to_representation(instance)
        return {name: value for name, value in shown.items() if name in instance}


class PlacementAlternativeSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(
        choices=[
            ("context", "a smaller context on the same GPUs"),
            ("utilization", "the share other deployments leave on the same GPUs"),
            ("version", "a quantized sibling from the registry's lineage"),
            ("host", "another host"),
        ]
    )
    label = serializers.CharField()  # type: ignore[assignment]
    reason = serializers.CharField()
    changes = PlacementChangesSerializer()


class PlacementAnswerSerializer(serializers.Serializer):
    """Free memory per GPU, a proposed placement, the verdict with its arithmetic, and what would fit."""

    engine_uses_gpus = serializers.BooleanField()
    note = serializers.CharField(allow_blank=True)
    hosts = HostFreeSerializer(many=True)
    proposed = ProposedPlacementSerializer(allow_null=True)
    verdict = VerdictSerializer(allow_null=True)
    alternatives = PlacementAlternativeSerializer(many=True)
