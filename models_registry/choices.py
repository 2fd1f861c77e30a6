"""Fixed vocabularies of the model registry."""

from __future__ import annotations

from django.db import models


class SourceKind(models.TextChoices):
    DIRECTORY = "directory", "Directory"
    GGUF = "gguf", "GGUF file"


class VersionState(models.TextChoices):
    REGISTERED = "registered", "Registered"
    VERIFIED = "verified", "Verified"
    FAILED = "failed", "Failed"


class ProblemKind(models.TextChoices):
    MISMATCH = "mismatch", "Hash or size mismatch"
    MISSING = "missing", "Missing"
    EXTRA = "extra", "Extra weight file"
    UNREADABLE = "unreadable", "Unreadable"


class QuantMethod(models.TextChoices):
    NONE = "none", "None (checkpoint dtype)"
    FP16 = "fp16", "FP16"
    BF16 = "bf16", "BF16"
    FP8 = "fp8", "FP8"
    INT8 = "int8", "INT8"
    AWQ = "awq", "AWQ"
    GPTQ = "gptq", "GPTQ"
    GGUF_Q2_K = "gguf-q2_k", "GGUF Q2_K"
    GGUF_Q3_K = "gguf-q3_k", "GGUF Q3_K"
    GGUF_Q4_0 = "gguf-q4_0", "GGUF Q4_0"
    GGUF_Q4_1 = "gguf-q4_1", "GGUF Q4_1"
    GGUF_Q4_K = "gguf-q4_k", "GGUF Q4_K"
    GGUF_Q5_0 = "gguf-q5_0", "GGUF Q5_0"
    GGUF_Q5_1 = "gguf-q5_1", "GGUF Q5_1"
    GGUF_Q5_K = "gguf-q5_k", "GGUF Q5_K"
    GGUF_Q6_K = "gguf-q6_k", "GGUF Q6_K"
    GGUF_Q8_0 = "gguf-q8_0", "GGUF Q8_0"


class KVCacheDtype(models.TextChoices):
    # vLLM's --kv-cache-dtype values; "auto" means the model's own dtype.
    AUTO = "auto", "auto (model dtype)"
    FP16 = "fp16", "FP16"
    BF16 = "bf16", "BF16"
    FP8 = "fp8", "FP8"
    FP8_E4M3 = "fp8_e4m3", "FP8 E4M3"
    FP8_E5M2 = "fp8_e5m2", "FP8 E5M2"
    FP32 = "fp32", "FP32"


class StoreKind(models.TextChoices):
    # A directory every agent can read (an NFS mount, or the control plane's disk in a one-host setup).
    DIRECTORY = "directory", "Directory"
    # Any HTTP(S) server that answers Range requests (nginx, caddy, an object store's public endpoint).
    HTTP = "http", "HTTP server"
    # An S3-compatible bucket, read with boto3 on the agent (optional extra `s3`).
    S3 = "s3", "S3-compatible bucket"
