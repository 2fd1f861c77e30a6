"""Model families, their versions with file manifests, verification history, quantization and aliases."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from models_registry.choices import KVCacheDtype, QuantMethod, SourceKind, StoreKind, VersionState

# Evaluation suites live in their own module; importing them here registers them with this app.
from models_registry.evaluation.models import (  # noqa: F401
    EvalCase,
    EvalReview,
    EvalRun,
    EvalSample,
    EvalSuite,
    EvalSuiteVersion,
    EvalVerdict,
)


class Model(models.Model):
    """A model family (e.g. Llama 3 8B Instruct): what its versions have in common."""

    name = models.CharField(max_length=200, unique=True)
    # The family's architecture class as its config names it, e.g. LlamaForCausalLM or llama (GGUF).
    architecture = models.CharField(max_length=100, blank=True, default="")
    # Free task tags such as chat, code, long-context; routing policies branch on them.
    task_tags = models.JSONField(default=list, blank=True)
    description = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class QuantizationConfig(models.Model):
    """How a version's weights (and KV cache) are quantized; it drives the memory estimate and vLLM flags."""

    name = models.CharField(max_length=100, unique=True)
    method = models.CharField(max_length=16, choices=QuantMethod.choices, default=QuantMethod.NONE)
    # Bits per weight of the quantized linear layers (16 for fp16/bf16, 8 for fp8/int8, 4 for awq/gptq).
    bits = models.PositiveSmallIntegerField(default=16)
    # Weights per scale group (awq/gptq); null when the method has no groups or uses per-channel scales.
    group_size = models.PositiveIntegerField(null=True, blank=True)
    kv_cache_dtype = models.CharField(max_length=16, choices=KVCacheDtype.choices, default=KVCacheDtype.AUTO)
    description = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ModelVersion(models.Model):
    """One concrete set of weight files of a model (a directory or one GGUF file), pinned by a manifest."""

    model = models.ForeignKey(Model, on_delete=models.PROTECT, related_name="versions")
    revision = models.CharField(max_length=200)
    source_kind = models.CharField(max_length=16, choices=SourceKind.choices)
    # Absolute path of the directory or .gguf file; the same path is expected on every node host.
    source_path = models.CharField(max_length=1024)
    parameter_count = models.BigIntegerField(null=True, blank=True)
    max_context = models.PositiveIntegerField(null=True, blank=True)
    # Normalised architecture facts for the memory estimate: num_layers, hidden_size, num_attention_heads,
    # num_kv_heads, head_dim, vocab_size, intermediate_size, dtype, weight_bytes (when measured) ...
    architecture = models.JSONField(default=dict, blank=True)
    # tokenizer.json inside the directory, or the GGUF file itself (it embeds the vocabulary).
    tokenizer_path = models.CharField(max_length=1024, null=True, blank=True)
    state = models.CharField(max_length=16, choices=VersionState.choices, default=VersionState.REGISTERED)
    # sha256 over the sorted manifest lines "<sha256> <size> <path>"; pins the whole file set.
    manifest_digest = models.CharField(max_length=64, blank=True, default="")
    file_count = models.PositiveIntegerField(default=0)
    total_bytes = models.BigIntegerField(default=0)
    # The full-precision version this one was quantized from; evaluations use it as the reference.
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="quantized_children"
    )
    quantization = models.ForeignKey(
        QuantizationConfig, null=True, blank=True, on_delete=models.PROTECT, related_name="versions"
    )
    # How the files were made when the registry made them (the quantize action, models_registry/quantize.py):
    # tool, its versions, source version and file sha256, target type, parameters. Empty when registered.
    provenance = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model__name", "-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["model", "revision"], name="version_revision_unique_per_model"),
            models.CheckConstraint(condition=~models.Q(parent=models.F("id")), name="version_not_own_parent"),
        ]

    def __str__(self) -> str:
        return f"{self.model.name}@{self.revision}"


class ManifestFile(models.Model):
    """One file of a version's manifest: its path relative to the source, its size and sha256."""

    version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="files")
    path = models.CharField(max_length=1024)
    size = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)

    class Meta:
        ordering = ["path"]
        constraints = [models.UniqueConstraint(fields=["version", "path"], name="manifest_path_unique")]

    def __str__(self) -> str:
        return f"{self.path} ({self.size} bytes)"


class VerificationRun(models.Model):
    """One re-hash of a version's files on one host, compared with the manifest; kept as history."""

    version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="verifications")
    # A plain name, not a foreign key: node inventory depends on the registry, not the reverse.
    host_name = models.CharField(max_length=200, db_index=True)
    ok = models.BooleanField(default=False)
    # The manifest digest the files were compared with; a run for an older manifest does not count.
    manifest_digest = models.CharField(max_length=64, blank=True, default="")
    # [{path, kind: mismatch/missing/extra/unreadable, expected, actual}]
    problems = models.JSONField(default=list, blank=True)
    files_checked = models.PositiveIntegerField(default=0)
    bytes_hashed = models.BigIntegerField(default=0)
    cache_hits = models.PositiveIntegerField(default=0)
    # "registration", "task" or "api": why this run happened.
    trigger = models.CharField(max_length=16, default="task")
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    # A fetch a fleet agent reported: "<deployment>:<start token>:<host>", unique, so a replayed batch
    # records it once. Empty for every other run.
    fetch_key = models.CharField(max_length=300, blank=True, default="")

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["version", "host_name", "-started_at"], name="verification_latest")]
        constraints = [
            models.UniqueConstraint(
                fields=["fetch_key"], condition=~models.Q(fetch_key=""), name="verification_fetch_once"
            )
        ]

    def __str__(self) -> str:
        return f"{self.version} on {self.host_name}: {'ok' if self.ok else 'failed'}"


class HashCache(models.Model):
    """A file's sha256 remembered with the stat facts it was computed under, per host.

    A later hash of the same file reuses it while path, size, mtime and inode are unchanged, so a
    re-verify of an untouched multi-gigabyte tree costs one stat per file. (ctime is also compared.)
    """

    host_name = models.CharField(max_length=200)
    path = models.CharField(max_length=1024)
    size = models.BigIntegerField()
    mtime_ns = models.BigIntegerField()
    # ctime as well: `touch -d` can restore an mtime after an edit, but nothing user-space restores ctime.
    ctime_ns = models.BigIntegerField(default=0)
    inode = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    hashed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["host_name", "path"], name="hash_cache_host_path")]

    def __str__(self) -> str:
        return f"{self.host_name}:{self.path}"


class ModelAlias(models.Model):
    """The model name tenants send (and the engine's --served-model-name); points at the active version."""

    name = models.CharField(max_length=200, unique=True)
    active_version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="aliases")
    task_tags = models.JSONField(default=list, blank=True)
    description = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "model aliases"

    def __str__(self) -> str:
        return self.name


class ModelStore(models.Model):
    """Where node agents fetch a version's files from before a launch (docs/registry.md, "The model store").

    A version's files sit in the store under `<location>/<manifest_digest>/<manifest path>`; the agent
    copies them into its own model root, checking every byte against the manifest. At most one store is
    active; with none, agents use the version's `source_path` as before (same path on every host).
    """

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=16, choices=StoreKind.choices)
    # directory: an absolute path; http: a base URL (http:// or https://); s3: "bucket" or "bucket/prefix".
    location = models.CharField(max_length=1024)
    # S3 only: the endpoint of an S3-compatible service (MinIO, Ceph ...); blank for AWS itself.
    endpoint_url = models.CharField(max_length=1024, blank=True, default="")
    region = models.CharField(max_length=64, blank=True, default="")
    is_active = models.BooleanField(default=False)
    description = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["is_active"], condition=models.Q(is_active=True), name="one_active_model_store"
            )
        ]

    def __str__(self) -> str:
        return self.name
