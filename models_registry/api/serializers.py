from __future__ import annotations

from typing import Any

from drf_spectacular.helpers import lazy_serializer
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.api.base import StrictModelSerializer, StrictSerializerMixin
from models_registry.choices import KVCacheDtype, ProblemKind, QuantMethod, VersionState
from models_registry.models import (
    ManifestFile,
    Model,
    ModelAlias,
    ModelVersion,
    QuantizationConfig,
    VerificationRun,
)
from models_registry.quantize import TARGETS as QUANTIZE_TARGETS

MAX_MANIFEST_BYTES = 8 * 1024 * 1024


def validate_task_tags(value: list[str]) -> list[str]:
    cleaned = [tag.strip().lower() for tag in value]
    if any(not tag for tag in cleaned):
        raise serializers.ValidationError(
            "Task tags must be non-empty words such as chat, code, long-context."
        )
    if len(set(cleaned)) != len(cleaned):
        raise serializers.ValidationError("A task tag is listed twice.")
    return cleaned


class ModelSerializer(StrictModelSerializer):
    task_tags = serializers.ListField(child=serializers.CharField(max_length=50), required=False)
    version_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Model
        fields = ["id", "name", "architecture", "task_tags", "description", "version_count", "created_at"]
        read_only_fields = ["id", "created_at", "version_count"]

    def validate_task_tags(self, value: list[str]) -> list[str]:
        return validate_task_tags(value)


class QuantizationConfigSerializer(StrictModelSerializer):
    class Meta:
        model = QuantizationConfig
        fields = ["id", "name", "method", "bits", "group_size", "kv_cache_dtype", "description", "created_at"]
        read_only_fields = ["id", "created_at"]

    def validate(self, attrs: Any) -> Any:
        attrs = super().validate(attrs)
        method = attrs.get("method", getattr(self.instance, "method", QuantMethod.NONE))
        bits = attrs.get("bits", getattr(self.instance, "bits", 16))
        group_size = attrs.get("group_size", getattr(self.instance, "group_size", None))
        allowed_bits = {
            QuantMethod.FP16: {16},
            QuantMethod.BF16: {16},
            QuantMethod.FP8: {8},
            QuantMethod.INT8: {8},
            QuantMethod.AWQ: {4},
            QuantMethod.GPTQ: {2, 3, 4, 8},
        }.get(method)
        if allowed_bits is not None and bits not in allowed_bits:
            shown = " or ".join(str(b) for b in sorted(allowed_bits))
            raise serializers.ValidationError({"bits": [f"{method} uses {shown} bits."]})
        if group_size is not None and method not in (QuantMethod.AWQ, QuantMethod.GPTQ):
            raise serializers.ValidationError({"group_size": ["Only awq and gptq have a group size."]})
        if group_size is not None and group_size not in (32, 64, 128, 256, 512, 1024):
            raise serializers.ValidationError({"group_size": ["Use a power of two from 32 to 1024."]})
        return attrs


class ManifestFileSerializer(serializers.ModelSerializer):
    class Meta:
        model = ManifestFile
        fields = ["path", "size", "sha256"]
        read_only_fields = fields


class ProblemSerializer(serializers.Serializer):
    """One file that did not match its manifest entry."""

    path = serializers.CharField()
    kind = serializers.ChoiceField(choices=ProblemKind.choices)
    expected = serializers.CharField(allow_null=True, help_text="The manifest's sha256, if listed.")
    actual = serializers.CharField(allow_null=True, help_text="The file's sha256, if readable.")
    detail = serializers.CharField(allow_blank=True)


@extend_schema_field(ProblemSerializer(many=True))
class ProblemsField(serializers.JSONField):
    pass


@extend_schema_field(OpenApiTypes.OBJECT)
class ArchitectureField(serializers.JSONField):
    """Normalised architecture facts (num_layers, hidden_size, ...): keys vary by model family."""


class TensorTypeSerializer(serializers.Serializer):
    type = serializers.CharField(help_text="ggml's tensor type (Q4_0, Q2_K, F32 ...).")
    tensors = serializers.IntegerField()
    weights = serializers.IntegerField()
    bytes = serializers.IntegerField()
    share = serializers.FloatField(help_text="Of all the file's weights.")
    bits_per_weight = serializers.FloatField()


class RequestedTypeSerializer(serializers.Serializer):
    type = serializers.CharField(help_text="The target type asked for (llama-quantize's name).")
    tensor_type = serializers.CharField(help_text="The tensor type most of its weights are meant to get.")
    nominal_bits_per_weight = serializers.FloatField()
    share = serializers.FloatField(help_text="Of the weights, in that tensor type.")


class TensorReportSerializer(serializers.Serializer):
    """What a GGUF file holds, read from its tensors (models_registry.quantize.tensor_report)."""

    weights = serializers.IntegerField()
    bytes = serializers.IntegerField()
    bits_per_weight = serializers.FloatField()
    tensor_types = TensorTypeSerializer(many=True)
    requested = RequestedTypeSerializer(allow_null=True)
    warning = serializers.CharField(
        allow_null=True, help_text="Set when llama.cpp fell back for most weights."
    )


class ProvenanceSerializer(serializers.Serializer):
    """How the registry made the files (the quantize action); empty for a registered version."""

    tool = serializers.CharField(required=False)
    llama_cpp_python = serializers.CharField(required=False)
    llama_cpp = serializers.CharField(required=False)
    source_version = serializers.IntegerField(required=False)
    source_file = serializers.CharField(required=False)
    source_sha256 = serializers.CharField(required=False)
    target_type = serializers.CharField(required=False)
    params = serializers.DictField(required=False)
    seconds = serializers.FloatField(required=False)
    host = serializers.CharField(required=False)
    produced = TensorReportSerializer(required=False, help_text="What llama.cpp actually wrote.")


@extend_schema_field(ProvenanceSerializer)
class ProvenanceField(serializers.JSONField):
    """How the registry made the files (quantize action): tool, versions, source sha256, target, params,
    and what the file holds (`produced`)."""


class VerificationRunSerializer(serializers.ModelSerializer):
    problems = ProblemsField(read_only=True)

    class Meta:
        model = VerificationRun
        fields = [
            "id",
            "version",
            "host_name",
            "ok",
            "manifest_digest",
            "problems",
            "files_checked",
            "bytes_hashed",
            "cache_hits",
            "trigger",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields


class ModelVersionSerializer(serializers.ModelSerializer):
    """A version as listed and shown. Versions are created through registration, never edited by hand."""

    model_name = serializers.CharField(source="model.name", read_only=True)
    quantization_name = serializers.CharField(
        source="quantization.name", read_only=True, default=None, allow_null=True
    )
    architecture = ArchitectureField(read_only=True)
    provenance = ProvenanceField(read_only=True)
    parent_label = serializers.SerializerMethodField()
    aliases = serializers.SerializerMethodField()

    class Meta:
        model = ModelVersion
        fields = [
            "id",
            "model",
            "model_name",
            "revision",
            "source_kind",
            "source_path",
            "parameter_count",
            "max_context",
            "architecture",
            "tokenizer_path",
            "state",
            "manifest_digest",
            "file_count",
            "total_bytes",
            "parent",
            "parent_label",
            "quantization",
            "quantization_name",
            "provenance",
            "aliases",
            "created_at",
        ]
        read_only_fields = fields

    def get_parent_label(self, obj: ModelVersion) -> str | None:
        return str(obj.parent) if obj.parent_id else None

    def get_aliases(self, obj: ModelVersion) -> list[str]:
        return [alias.name for alias in obj.aliases.all()]


class RegisterVersionSerializer(StrictSerializerMixin, serializers.Serializer):
    """Registration from a server-side path, optionally checked against an uploaded manifest."""

    model = serializers.PrimaryKeyRelatedField(queryset=Model.objects.all())
    revision = serializers.CharField(max_length=200)
    source_path = serializers.CharField(max_length=1024)
    quantization = serializers.PrimaryKeyRelatedField(
        queryset=QuantizationConfig.objects.all(), required=False, allow_null=True
    )
    # A serializer's own `parent` attribute is shadowed only in the type stubs; DRF collects fields first.
    parent = serializers.PrimaryKeyRelatedField(  # type: ignore[assignment]
        queryset=ModelVersion.objects.all(), required=False, allow_null=True
    )
    parameter_count = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    max_context = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    manifest = serializers.CharField(
        required=False,
        allow_blank=False,
        trim_whitespace=False,
        help_text="sha256sum output or JSON {files: [{path, size, sha256}]}; the files must match it.",
    )
    manifest_file = serializers.FileField(required=False, help_text="The same manifest, as an uploaded file.")

    def validate_manifest_file(self, value: Any) -> str:
        if value.size > MAX_MANIFEST_BYTES:
            raise serializers.ValidationError("A manifest file may be at most 8 MiB.")
        try:
            return str(value.read().decode("utf-8"))
        except UnicodeDecodeError:
            raise serializers.ValidationError("A manifest file must be UTF-8 text.") from None

    def validate(self, attrs: Any) -> Any:
        attrs = super().validate(attrs)
        if "manifest" in attrs and "manifest_file" in attrs:
            raise serializers.ValidationError(
                {"manifest_file": ["Give the manifest as text or as a file, not both."]}
            )
        return attrs


class QuantizeRequestSerializer(StrictSerializerMixin, serializers.Serializer):
    """Make a lower-bit GGUF from this GGUF version with llama.cpp's quantizer (requantizing allowed)."""

    target_type = serializers.ChoiceField(
        choices=list(QUANTIZE_TARGETS),
        error_messages={
            "invalid_choice": '"{input}" is not a type this action makes; choose one of '
            + ", ".join(QUANTIZE_TARGETS)
            + "."
        },
    )
    revision = serializers.CharField(
        max_length=200, required=False, help_text="The new version's revision; default <source>-<target>."
    )
    nthread = serializers.IntegerField(
        min_value=0, max_value=256, default=0, help_text="Quantizer threads; 0 lets llama.cpp use every core."
    )


class QuantizeQueuedSerializer(serializers.Serializer):
    queued = serializers.BooleanField()
    source = serializers.IntegerField()  # type: ignore[assignment]
    target_type = serializers.CharField()
    revision = serializers.CharField(help_text="The version it will be registered as.")
    output_path = serializers.CharField(help_text="Where the new GGUF file is written.")


class VerifyRequestSerializer(StrictSerializerMixin, serializers.Serializer):
    host_name = serializers.CharField(max_length=200)


class VerifyQueuedSerializer(serializers.Serializer):
    queued = serializers.BooleanField()
    host_name = serializers.CharField()
    queue = serializers.CharField(help_text="The Celery queue of that host's agent.")


class LineageNodeSerializer(serializers.Serializer):
    """A version in the lineage forest, with the versions quantized from it."""

    id = serializers.IntegerField()
    label = serializers.CharField()  # type: ignore[assignment]
    model = serializers.IntegerField()
    revision = serializers.CharField()
    state = serializers.ChoiceField(choices=VersionState.choices)
    quantization = serializers.CharField(allow_null=True, help_text="The quantization config's name.")
    method = serializers.ChoiceField(choices=QuantMethod.choices, allow_null=True)
    children = serializers.SerializerMethodField()

    @extend_schema_field(lazy_serializer("models_registry.api.serializers.LineageNodeSerializer")(many=True))
    def get_children(self, obj: dict[str, Any]) -> list[Any]:
        return list(LineageNodeSerializer(obj["children"], many=True).data)


class SwitchAliasSerializer(StrictSerializerMixin, serializers.Serializer):
    version = serializers.PrimaryKeyRelatedField(queryset=ModelVersion.objects.all())


class ModelAliasSerializer(StrictModelSerializer):
    """An alias. `active_version` is set on create; later changes go through the audited switch action."""

    task_tags = serializers.ListField(child=serializers.CharField(max_length=50), required=False)
    active_version_label = serializers.SerializerMethodField()
    active_version_state = serializers.ChoiceField(
        choices=VersionState.choices, source="active_version.state", read_only=True
    )

    class Meta:
        model = ModelAlias
        fields = [
            "id",
            "name",
            "active_version",
            "active_version_label",
            "active_version_state",
            "task_tags",
            "description",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["id", "created_at", "updated_at", "active_version_label", "active_version_state"]

    def get_fields(self) -> dict[str, Any]:
        fields = super().get_fields()
        if self.instance is not None and not isinstance(self.instance, list | tuple):
            fields["active_version"].read_only = True  # switch it with POST .../switch/, which is audited
        return fields

    def get_active_version_label(self, obj: ModelAlias) -> str:
        return str(obj.active_version)

    def validate_task_tags(self, value: list[str]) -> list[str]:
        return validate_task_tags(value)

    def validate_name(self, value: str) -> str:
        name = value.strip()
        if not name or any(ch.isspace() for ch in name):
            raise serializers.ValidationError("An alias is the model name clients send: no spaces.")
        return name

    def validate_active_version(self, value: ModelVersion) -> ModelVersion:
        if value.state == VersionState.FAILED:
            raise serializers.ValidationError(f"{value} failed verification; it cannot serve an alias.")
        return value


class FitCheckSerializer(StrictSerializerMixin, serializers.Serializer):
    """Inputs of the fit calculator; memory in GiB or bytes (bytes win when both are given)."""

    version = serializers.PrimaryKeyRelatedField(queryset=ModelVersion.objects.all())
    quantization = serializers.PrimaryKeyRelatedField(
        queryset=QuantizationConfig.objects.all(), required=False, allow_null=True
    )
    method = serializers.ChoiceField(choices=QuantMethod.choices, required=False, allow_null=True)
    kv_cache_dtype = serializers.ChoiceField(choices=KVCacheDtype.choices, required=False, allow_null=True)
    gpu_memory_gib = serializers.FloatField(min_value=0.1, max_value=4096, required=False)
    gpu_memory_bytes = serializers.IntegerField(min_value=1, required=False)
    gpu_memory_utilization = serializers.FloatField(
        min_value=0.01,
        max_value=1.0,
        required=False,
        allow_null=True,
        default=None,
        help_text="Omitted or null: vLLM's default (0.92).",
    )
    max_model_len = serializers.IntegerField(min_value=1, max_value=10_000_000)
    max_num_seqs = serializers.IntegerField(
        min_value=1,
        max_value=100_000,
        required=False,
        allow_null=True,
        default=None,
        help_text="Omitted or null: what vLLM picks for this GPU (get_batch_defaults).",
    )
    max_num_batched_tokens = serializers.IntegerField(
        min_value=1, required=False, allow_null=True, default=None
    )
    gpu_name = serializers.CharField(
        required=False, default="", allow_blank=True, help_text="The GPU's name (A100 defaults differ)."
    )
    other_reserved_bytes = serializers.IntegerField(min_value=0, default=0)
    overhead_bytes = serializers.IntegerField(min_value=0, required=False)
    tensor_parallel_size = serializers.IntegerField(min_value=1, max_value=64, default=1)
    pipeline_parallel_size = serializers.IntegerField(min_value=1, max_value=64, default=1)

    def validate(self, attrs: Any) -> Any:
        attrs = super().validate(attrs)
        if "gpu_memory_bytes" not in attrs and "gpu_memory_gib" not in attrs:
            raise serializers.ValidationError({"gpu_memory_gib": ["Give the GPU memory (GiB or bytes)."]})
        if attrs.get("quantization") is not None and attrs.get("method"):
            raise serializers.ValidationError(
                {"method": ["Give a quantization config or a method, not both."]}
            )
        return attrs


class StepSerializer(serializers.Serializer):
    label = serializers.CharField()  # type: ignore[assignment]
    formula = serializers.CharField()
    value = serializers.FloatField()
    unit = serializers.ChoiceField(
        choices=[("bytes", "bytes"), ("tokens", "tokens"), ("count", "count")],
        help_text="What `value` counts: a token count is not shown as bytes.",
    )


class FitResultSerializer(serializers.Serializer):
    fits = serializers.BooleanField()
    reason = serializers.CharField()
    parameter_count = serializers.IntegerField()
    weight_bytes = serializers.IntegerField()
    kv_bytes_per_token = serializers.IntegerField()
    kv_tokens_available = serializers.IntegerField()
    max_context_that_fits = serializers.IntegerField()
    full_length_sequences = serializers.IntegerField()
    budget_bytes = serializers.IntegerField()
    kv_cache_bytes = serializers.IntegerField()
    steps = StepSerializer(many=True)
    gpu_memory_utilization = serializers.FloatField(help_text="The value used (vLLM's default when omitted).")
    max_num_seqs = serializers.IntegerField(help_text="The value used (vLLM's default when omitted).")
    max_num_batched_tokens = serializers.IntegerField(allow_null=True)
    vllm_defaults = serializers.ListField(
        child=serializers.CharField(), help_text="Values vLLM picks itself (flag omitted), and by which rule."
    )
