"""Serializers of hosts, GPUs, deployments and their history, with live values from Redis."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from core.api.base import StrictModelSerializer, StrictSerializerMixin
from models_registry.models import ModelVersion, QuantizationConfig
from nodes.choices import ACTIVE_STATES, Engine
from nodes.lifecycle import host_is_reachable, live_deployment_key, live_gpu_key, read_live
from nodes.models import Deployment, DeploymentEvent, Gpu, Host
from nodes.preflight import fit_to_dict, preflight
from nodes.spec import DeploySpec


class GpuSerializer(serializers.ModelSerializer):
    live = serializers.SerializerMethodField()

    class Meta:
        model = Gpu
        fields = ["id", "index", "uuid", "name", "memory_total_bytes", "simulated", "last_seen", "live"]
        read_only_fields = fields

    def get_live(self, obj: Gpu) -> dict[str, Any] | None:
        redis_key = live_gpu_key(obj.host.name, obj.index)
        prefetched = self.context.get("live")
        return prefetched.get(redis_key) if prefetched is not None else read_live(redis_key)


class HostSerializer(StrictModelSerializer):
    """A host; GPUs, heartbeat and state come from its agent and are read-only here."""

    gpus = GpuSerializer(many=True, read_only=True)
    reachable = serializers.SerializerMethodField()
    agent_queue = serializers.CharField(read_only=True)
    deployment_count = serializers.SerializerMethodField()

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
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["state", "last_heartbeat", "agent_info", "created_at", "updated_at"]

    def get_reachable(self, obj: Host) -> bool:
        return host_is_reachable(obj)

    def get_deployment_count(self, obj: Host) -> int:
        return sum(1 for d in obj.deployments.all() if d.state in ACTIVE_STATES)

    def validate_labels(self, value: Any) -> Any:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise serializers.ValidationError("Labels are a JSON object of string keys.")
        return value


class DeploymentEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = DeploymentEvent
        fields = ["id", "at", "from_state", "to_state", "message", "log_tail"]
        read_only_fields = fields


ENGINE_PARAMS = [
    "gpu_indices",
    "gpu_memory_utilization",
    "max_model_len",
    "block_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "tensor_parallel_size",
    "enable_prefix_caching",
    "extra_args",
    "port",
]


class DeploymentSerializer(StrictModelSerializer):
    """A deployment. Creating one runs every pre-launch check; refusals are field errors (400)."""

    host_name = serializers.CharField(source="host.name", read_only=True)
    model_version_label = serializers.CharField(source="model_version.__str__", read_only=True)
    base_url = serializers.CharField(read_only=True)
    live = serializers.SerializerMethodField()
    fit = serializers.SerializerMethodField()

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
            *ENGINE_PARAMS,
            "served_model_name",
            "role",
            "desired_state",
            "state",
            "state_reason",
            "state_changed_at",
            "pid",
            "launch_argv",
            "started_at",
            "ready_at",
            "restart_count",
            "next_restart_at",
            "last_log_lines",
            "base_url",
            "live",
            "fit",
            "created_at",
            "updated_at",
        ]
        read_only_fields = [
            "desired_state",
            "state",
            "state_reason",
            "state_changed_at",
            "pid",
            "launch_argv",
            "started_at",
            "ready_at",
            "restart_count",
            "next_restart_at",
            "last_log_lines",
            "created_at",
            "updated_at",
        ]

    def get_live(self, obj: Deployment) -> dict[str, Any] | None:
        redis_key = live_deployment_key(obj.pk)
        prefetched = self.context.get("live")
        return prefetched.get(redis_key) if prefetched is not None else read_live(redis_key)

    def get_fit(self, obj: Deployment) -> dict[str, Any] | None:
        return getattr(self, "_fit", None)

    def validate(self, attrs: Any) -> Any:
        attrs = super().validate(attrs)
        instance: Deployment | None = self.instance
        if instance is not None and instance.state in ACTIVE_STATES:
            changed = [k for k in attrs if k not in ("name", "role")]
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
        # The row stores what was checked, the tensor-parallel default included.
        attrs["tensor_parallel_size"] = spec.tensor_parallel_size
        check = preflight(spec, exclude_id=instance.pk if instance is not None else None)
        self._fit = fit_to_dict(check.fit)
        if not check.ok:
            raise serializers.ValidationError(check.errors)
        return attrs


class PreflightSerializer(StrictSerializerMixin, serializers.Serializer):
    """The deploy wizard's "check before launch": the same checks as create, nothing saved."""

    model_version = serializers.PrimaryKeyRelatedField(queryset=ModelVersion.objects.all())
    quantization = serializers.PrimaryKeyRelatedField(
        queryset=QuantizationConfig.objects.all(), required=False, allow_null=True
    )
    engine = serializers.ChoiceField(choices=Engine.choices, default=Engine.VLLM)
    host = serializers.PrimaryKeyRelatedField(queryset=Host.objects.all())
    gpu_indices = serializers.ListField(child=serializers.IntegerField(min_value=0), default=list)
    gpu_memory_utilization = serializers.FloatField(default=0.9)
    max_model_len = serializers.IntegerField(default=4096, min_value=1)
    block_size = serializers.IntegerField(default=16)
    max_num_seqs = serializers.IntegerField(default=256, min_value=1)
    max_num_batched_tokens = serializers.IntegerField(required=False, allow_null=True, min_value=1)
    tensor_parallel_size = serializers.IntegerField(required=False, min_value=1)
    enable_prefix_caching = serializers.BooleanField(default=True)
    extra_args = serializers.ListField(child=serializers.CharField(), default=list)
    port = serializers.IntegerField(min_value=1024, max_value=65535)


class StopSerializer(StrictSerializerMixin, serializers.Serializer):
    drain = serializers.BooleanField(default=False)
