"""Architecture facts from config.json or GGUF metadata, memory estimates and the "will it fit?" check.

The arithmetic follows what vLLM does at start-up: the engine may use
`gpu_memory_bytes * gpu_memory_utilization`; weights and runtime overhead come off the top; what is
left becomes KV-cache blocks of 16 tokens. Every step is returned with its formula so the console can
show the working, not just a verdict.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gguf

# Bytes per element of the dtypes a config or --kv-cache-dtype can name.
DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "bfloat16": 2,
    "bf16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
}
# Effective bits per weight of llama.cpp block formats, scales included (ggml-common.h block layouts).
GGUF_BITS_PER_WEIGHT: dict[str, float] = {
    "gguf-q2_k": 2.625,
    "gguf-q3_k": 3.4375,
    "gguf-q4_0": 4.5,
    "gguf-q4_1": 5.0,
    "gguf-q4_k": 4.5,
    "gguf-q5_0": 5.5,
    "gguf-q5_1": 6.0,
    "gguf-q5_k": 5.5,
    "gguf-q6_k": 6.5625,
    "gguf-q8_0": 8.5,
}
# vLLM allocates the KV cache in blocks of this many tokens.
KV_BLOCK_TOKENS = 16
# CUDA context, activation peak of the profiling run and CUDA graphs: vLLM typically logs 1-2 GiB for a
# 7-8B model. An assumption, shown as such in the steps, and overridable per call.
DEFAULT_OVERHEAD_BYTES = 1 * 1024**3
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
GIB = 1024**3


class ArchitectureError(ValueError):
    """A config.json, safetensors header or GGUF file that cannot be read as a model architecture."""


@dataclass(frozen=True)
class Step:
    """One line of the shown arithmetic: what is computed, how, and the result."""

    label: str
    formula: str
    value: float | int
    # What `value` counts, so a page never shows a token count as bytes: bytes, tokens or count.
    unit: str = "bytes"


@dataclass
class MemoryEstimate:
    parameter_count: int
    weight_bytes: int
    kv_bytes_per_token: int
    weight_format: str
    kv_cache_dtype: str
    steps: list[Step] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# vLLM's own values when a flag is omitted (tests/data/vllm/serve-flags.md, vLLM @ 2f41c894): the
# console passes a flag only when the admin sets it, so the estimate must use what vLLM will use.
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.92  # vllm/config/cache.py:80 (0.9 before PR #38284)
VLLM_DEFAULT_BLOCK_SIZE = 16  # CacheConfig.DEFAULT_BLOCK_SIZE, vllm/config/cache.py:59
GIB_BYTES = 1 << 30  # vLLM's GiB_bytes


@dataclass(frozen=True)
class VllmBatchDefaults:
    """max_num_seqs / max_num_batched_tokens as `vllm serve` resolves them, and the rule that chose them."""

    max_num_seqs: int
    max_num_batched_tokens: int
    rule: str


def vllm_batch_defaults(
    device_memory_bytes: int,
    device_name: str,
    *,
    max_model_len: int,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    enable_chunked_prefill: bool = True,
) -> VllmBatchDefaults:
    """The values vLLM's API server uses, by the rules of `EngineArgs.get_batch_defaults()` and
    `_set_default_max_num_seqs_and_batched_tokens_args()` (vllm/engine/arg_utils.py:2566-2657 and
    2769-2860 @ 2f41c894; see tests/data/vllm/serve-flags.md). CUDA GPUs only (the console runs no
    TPU/CPU vLLM); `--performance-mode throughput`, which doubles max_num_seqs, is not modelled.

    `device_memory_bytes` is ONE GPU's memory (vLLM asks `current_platform.get_device_total_memory()`).
    Given values are kept as they are; only the omitted ones are defaulted, and the caps apply only then.
    """
    name = device_name.lower()
    if device_memory_bytes >= 160 * GIB_BYTES:
        tokens, seqs = 16384, 1024
        rule = "≥160 GiB GPU (B200/B300 class)"
    elif device_memory_bytes >= 70 * GIB_BYTES and "a100" not in name:
        tokens, seqs = 8192, 1024
        rule = "≥70 GiB GPU that is not an A100 (H100/H200 class)"
    else:
        tokens, seqs = 2048, 256
        rule = "GPU under 70 GiB, or an A100"
    seqs_out = max_num_seqs if max_num_seqs is not None else seqs
    tokens_out = max_num_batched_tokens if max_num_batched_tokens is not None else tokens
    if max_num_batched_tokens is None:
        if not enable_chunked_prefill:
            tokens_out = max(max_model_len, tokens_out)
        tokens_out = min(seqs_out * max_model_len, tokens_out)
    if max_num_seqs is None:
        seqs_out = min(seqs_out, tokens_out)
    return VllmBatchDefaults(max_num_seqs=seqs_out, max_num_batched_tokens=tokens_out, rule=rule)


@dataclass
class FitResult:
    """The answer to "will it fit?", with the numbers behind it."""

    fits: bool
    weight_bytes: int
    kv_bytes_per_token: int
    kv_tokens_available: int
    max_context_that_fits: int
    reason: str
    steps: list[Step] = field(default_factory=list)
    full_length_sequences: int = 0
    budget_bytes: int = 0
    kv_cache_bytes: int = 0
    parameter_count: int = 0
    # The engine values the check used; `vllm_defaults` names those vLLM itself picks (flag omitted).
    gpu_memory_utilization: float = 0.0
    max_num_seqs: int = 0
    max_num_batched_tokens: int | None = None
    vllm_defaults: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------- reading architectures


def _first(config: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        value = config.get(name)
        if value is not None:
            return value
    return None


def _positive_int(value: Any, name: str, source: str) -> int:
    if isinstance(value, list):
        # Some architectures give one value per layer; the largest layer bounds the memory.
        value = max(value) if value else None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ArchitectureError(f"{source}: {name} must be a positive integer, got {value!r}.")
    return value


def architecture_from_config(config: Mapping[str, Any], source: str = "config.json") -> dict[str, Any]:
    """Normalise a Hugging Face config.json into the facts the estimate needs."""
    if not isinstance(config, Mapping):
        raise ArchitectureError(f"{source}: expected a JSON object.")
    outer = config
    # Multimodal wrappers (Gemma 3, Llava ...) keep the language model's facts under text_config.
    if "text_config" in config and _first(config, "num_hidden_layers", "n_layer", "num_layers") is None:
        config = {**config["text_config"]}
    layers = _positive_int(
        _first(config, "num_hidden_layers", "n_layer", "num_layers"), "num_hidden_layers", source
    )
    hidden = _positive_int(_first(config, "hidden_size", "n_embd", "d_model"), "hidden_size", source)
    heads = _positive_int(_first(config, "num_attention_heads", "n_head"), "num_attention_heads", source)
    kv_raw = _first(config, "num_key_value_heads", "num_kv_heads", "n_head_kv")
    if kv_raw is None and config.get("multi_query"):
        kv_raw = 1
    kv_heads = _positive_int(kv_raw if kv_raw is not None else heads, "num_key_value_heads", source)
    head_dim_raw = config.get("head_dim")
    head_dim = _positive_int(
        head_dim_raw if head_dim_raw is not None else hidden // heads, "head_dim", source
    )
    vocab = _positive_int(_first(config, "vocab_size", "padded_vocab_size"), "vocab_size", source)
    intermediate = _first(config, "intermediate_size", "ffn_dim", "n_inner") or 4 * hidden
    experts = _first(config, "num_local_experts", "num_experts", "n_routed_experts")
    arch: dict[str, Any] = {
        "format": "hf",
        "model_type": str(config.get("model_type") or outer.get("model_type") or ""),
        "architectures": list(outer.get("architectures") or []),
        "num_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "intermediate_size": _positive_int(intermediate, "intermediate_size", source),
        "tie_word_embeddings": bool(_first(config, "tie_word_embeddings", "tie_embeddings") or False),
        "dtype": str(
            _first(config, "torch_dtype", "dtype") or _first(outer, "torch_dtype", "dtype") or "float16"
        ),
        "max_position_embeddings": _first(config, "max_position_embeddings", "n_positions", "seq_length"),
    }
    if experts:
        arch["num_experts"] = _positive_int(experts, "num_local_experts", source)
        moe_intermediate = config.get("moe_intermediate_size")
        if moe_intermediate:
            arch["moe_intermediate_size"] = _positive_int(moe_intermediate, "moe_intermediate_size", source)
    quant = outer.get("quantization_config")
    if isinstance(quant, Mapping):
        arch["checkpoint_quantization"] = {
            "method": quant.get("quant_method"),
            "bits": quant.get("bits"),
            "group_size": quant.get("group_size"),
        }
    return arch


def read_safetensors_header(path: Path) -> tuple[int, int]:
    """(parameter count, tensor bytes) from a .safetensors file's JSON header, without reading the data."""
    try:
        with open(path, "rb") as handle:
            raw_len = handle.read(8)
            if len(raw_len) != 8:
                raise ArchitectureError(f"{path.name}: too short to be a safetensors file.")
            (header_len,) = struct.unpack("<Q", raw_len)
            if header_len > MAX_SAFETENSORS_HEADER:
                raise ArchitectureError(
                    f"{path.name}: safetensors header length {header_len} is implausible."
                )
            header = json.loads(handle.read(header_len))
    except (OSError, ValueError) as exc:
        if isinstance(exc, ArchitectureError):
            raise
        raise ArchitectureError(f"{path.name}: cannot read the safetensors header ({exc}).") from None
    params = 0
    nbytes = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            params += math.prod(int(d) for d in info["shape"])
            start, end = info["data_offsets"]
            nbytes += int(end) - int(start)
        except (KeyError, TypeError, ValueError):
            raise ArchitectureError(f"{path.name}: tensor {name!r} has a malformed header entry.") from None
    return params, nbytes


def read_directory(root: Path) -> tuple[dict[str, Any], int | None, int | None, str | None]:
    """(architecture, parameter count, max context, tokenizer path) of a Hugging Face style directory."""
    config_path = root / "config.json"
    arch: dict[str, Any] = {}
    max_context: int | None = None
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text())
        except (OSError, ValueError) as exc:
            raise ArchitectureError(f"config.json: not valid JSON ({exc}).") from None
        arch = architecture_from_config(config)
        max_pos = arch.get("max_position_embeddings")
        max_context = max_pos if isinstance(max_pos, int) and max_pos > 0 else None
    parameter_count: int | None = None
    shards = sorted(root.rglob("*.safetensors"))
    if shards:
        params = 0
        nbytes = 0
        for shard in shards:
            p, b = read_safetensors_header(shard)
            params += p
            nbytes += b
        parameter_count = params
        if arch:
            arch["weight_bytes"] = nbytes
            arch["parameter_count"] = params
    elif arch:
        parameter_count = parameter_breakdown(arch)["total"]
    tokenizer = root / "tokenizer.json"
    return arch, parameter_count, max_context, str(tokenizer) if tokenizer.is_file() else None


def read_gguf(path: Path) -> tuple[dict[str, Any], int, int | None]:
    """(architecture, parameter count, max context) from a GGUF file's metadata and tensor table."""
    try:
        reader = gguf.GGUFReader(path, "r")
    except Exception as exc:  # the reader raises ValueError, struct.error, IndexError... on a bad file
        raise ArchitectureError(f"{path.name}: not a valid GGUF file ({exc}).") from None

    def get(key: str) -> Any:
        found = reader.fields.get(key)
        return found.contents() if found is not None else None

    name = get("general.architecture")
    if not isinstance(name, str) or not name:
        raise ArchitectureError(f"{path.name}: GGUF metadata has no general.architecture.")
    source = f"{path.name} (GGUF)"
    layers = _positive_int(get(f"{name}.block_count"), f"{name}.block_count", source)
    hidden = _positive_int(get(f"{name}.embedding_length"), f"{name}.embedding_length", source)
    heads = _positive_int(get(f"{name}.attention.head_count"), f"{name}.attention.head_count", source)
    kv_raw = get(f"{name}.attention.head_count_kv")
    kv_heads = _positive_int(kv_raw if kv_raw is not None else heads, "head_count_kv", source)
    key_length = get(f"{name}.attention.key_length")
    head_dim = _positive_int(key_length if key_length is not None else hidden // heads, "key_length", source)
    vocab = get(f"{name}.vocab_size")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if vocab is None and tokens is not None:
        vocab = len(tokens.data)
    context = get(f"{name}.context_length")
    tensor_names = {t.name for t in reader.tensors}
    params = int(sum(int(t.n_elements) for t in reader.tensors))
    nbytes = int(sum(int(t.n_bytes) for t in reader.tensors))
    file_type = get("general.file_type")
    try:
        file_type_name = gguf.LlamaFileType(file_type).name if file_type is not None else ""
    except ValueError:
        file_type_name = str(file_type)
    arch: dict[str, Any] = {
        "format": "gguf",
        "model_type": name,
        "architectures": [name],
        "num_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": int(vocab) if vocab else None,
        "intermediate_size": get(f"{name}.feed_forward_length"),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        # llama.cpp keeps its KV cache in f16 unless told otherwise.
        "dtype": "float16",
        "file_type": file_type_name,
        "parameter_count": params,
        "weight_bytes": nbytes,
        "max_position_embeddings": context,
        "model_name": get("general.name") or "",
    }
    return arch, params, int(context) if isinstance(context, int) and context > 0 else None


# --------------------------------------------------------------------------- memory arithmetic


def parameter_breakdown(arch: Mapping[str, Any]) -> dict[str, int]:
    """Parameters split into quantizable linear layers and the rest (embeddings, head, norms).

    Assumes a decoder with gated MLP (Llama, Mistral, Qwen, Gemma): q/k/v/o projections plus
    gate/up/down per layer, and per-expert MLPs for mixture-of-experts models.
    """
    layers = int(arch["num_layers"])
    hidden = int(arch["hidden_size"])
    heads = int(arch["num_attention_heads"])
    kv_heads = int(arch["num_kv_heads"])
    head_dim = int(arch["head_dim"])
    vocab = int(arch.get("vocab_size") or 0)
    intermediate = int(arch.get("intermediate_size") or 4 * hidden)
    experts = int(arch.get("num_experts") or 1)
    expert_intermediate = int(arch.get("moe_intermediate_size") or intermediate)
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    mlp = 3 * hidden * expert_intermediate * experts
    router = hidden * experts if experts > 1 else 0
    linear = layers * (attention + mlp)
    embedding = vocab * hidden
    head = 0 if arch.get("tie_word_embeddings") else vocab * hidden
    other = embedding + head + layers * (2 * hidden + router) + hidden
    computed = linear + other
    measured = arch.get("parameter_count")
    if isinstance(measured, int) and measured > 0 and arch.get("format") != "gguf":
        # The checkpoint's own tensor count wins; what the formula missed (biases...) stays 16-bit.
        other = max(0, measured - linear)
    return {"linear": linear, "other": other, "total": linear + other, "computed": computed}


def dtype_bytes(name: str) -> float:
    try:
        return DTYPE_BYTES[name.lower()]
    except KeyError:
        raise ArchitectureError(f"Unknown dtype {name!r}.") from None


def estimate_memory(
    architecture: Mapping[str, Any],
    quantization: Any = None,
    kv_cache_dtype: str | None = None,
) -> MemoryEstimate:
    """Weight bytes and KV-cache bytes per token for `architecture` loaded with `quantization`.

    `quantization` is a QuantizationConfig, or a method name ("none", "fp16", "awq", "gguf-q4_0" ...),
    or None for the checkpoint as it is. `kv_cache_dtype` overrides the config's KV-cache dtype.
    """
    if not architecture or "num_layers" not in architecture:
        raise ArchitectureError("This version has no architecture (no config.json or GGUF metadata).")
    method = "none"
    bits: int | None = None
    group_size: int | None = None
    kv_dtype = kv_cache_dtype or "auto"
    if quantization is not None and not isinstance(quantization, str):
        method = str(quantization.method)
        bits = int(quantization.bits)
        group_size = quantization.group_size
        kv_dtype = kv_cache_dtype or str(quantization.kv_cache_dtype)
    elif isinstance(quantization, str):
        method = quantization

    steps: list[Step] = []
    parts = parameter_breakdown(architecture)
    total = parts["total"]
    linear = parts["linear"]
    other = parts["other"]
    steps.append(
        Step(
            "parameters",
            f"linear {linear:,} + embeddings/head/norms {other:,}",
            total,
            "count",
        )
    )
    model_dtype = str(architecture.get("dtype") or "float16").lower()
    # vLLM loads a float32 checkpoint as float16 unless told otherwise.
    load_dtype = "float16" if dtype_bytes(model_dtype) > 2 else model_dtype
    measured_bytes = architecture.get("weight_bytes")

    if method == "none":
        if isinstance(measured_bytes, int) and measured_bytes > 0 and dtype_bytes(model_dtype) <= 2:
            weight_bytes = measured_bytes
            steps.append(Step("weights", "tensor bytes measured in the checkpoint files", weight_bytes))
        else:
            per = dtype_bytes(load_dtype)
            weight_bytes = int(total * per)
            steps.append(Step("weights", f"{total:,} params x {per:g} B ({load_dtype})", weight_bytes))
        weight_format = architecture.get("file_type") or load_dtype
    elif method in ("fp16", "bf16"):
        weight_bytes = total * 2
        steps.append(Step("weights", f"{total:,} params x 2 B ({method})", weight_bytes))
        weight_format = method
    elif method in ("fp8", "int8"):
        weight_bytes = linear + other * 2
        steps.append(
            Step("weights", f"linear {linear:,} x 1 B ({method}) + other {other:,} x 2 B", weight_bytes)
        )
        weight_format = method
    elif method in ("awq", "gptq"):
        wbits = bits or 4
        # Per group: one fp16 scale and one packed zero point of `wbits` bits.
        overhead = (16 + wbits) / group_size if group_size else 0.0
        per_weight = wbits + overhead
        weight_bytes = int(linear * per_weight / 8) + other * 2
        steps.append(
            Step(
                "weights",
                f"linear {linear:,} x ({wbits} + (16 + {wbits}) / {group_size or 'n/a'}) bits / 8"
                f" + other {other:,} x 2 B ({method})",
                weight_bytes,
            )
        )
        weight_format = f"{method} {wbits}-bit"
    elif method in GGUF_BITS_PER_WEIGHT:
        if architecture.get("format") == "gguf" and isinstance(measured_bytes, int) and measured_bytes > 0:
            weight_bytes = measured_bytes
            steps.append(Step("weights", "tensor bytes measured in the GGUF file", weight_bytes))
        else:
            bpw = GGUF_BITS_PER_WEIGHT[method]
            weight_bytes = int(total * bpw / 8)
            steps.append(Step("weights", f"{total:,} params x {bpw} bits / 8 ({method})", weight_bytes))
        weight_format = method
    else:
        raise ArchitectureError(f"Unknown quantization method {method!r}.")

    kv_name = load_dtype if kv_dtype == "auto" else kv_dtype
    kv_per = dtype_bytes(kv_name)
    layers = int(architecture["num_layers"])
    kv_heads = int(architecture["num_kv_heads"])
    head_dim = int(architecture["head_dim"])
    kv_bytes = int(2 * layers * kv_heads * head_dim * kv_per)
    steps.append(
        Step(
            "KV cache per token",
            f"2 (K and V) x {layers} layers x {kv_heads} KV heads x {head_dim} head dim"
            f" x {kv_per:g} B ({kv_name})",
            kv_bytes,
        )
    )
    return MemoryEstimate(
        parameter_count=total,
        weight_bytes=weight_bytes,
        kv_bytes_per_token=kv_bytes,
        weight_format=str(weight_format),
        kv_cache_dtype=kv_name,
        steps=steps,
    )


def fit_architecture(
    architecture: Mapping[str, Any],
    *,
    max_context: int | None,
    quantization: Any,
    gpu_memory_bytes: int,
    gpu_memory_utilization: float | None,
    max_model_len: int,
    max_num_seqs: int | None,
    other_reserved_bytes: int = 0,
    overhead_bytes: int = DEFAULT_OVERHEAD_BYTES,
    kv_cache_dtype: str | None = None,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    gpu_name: str = "",
    max_num_batched_tokens: int | None = None,
) -> FitResult:
    """The fit check on a bare architecture; `fit_check` in services wraps it for a ModelVersion.

    With tensor and/or pipeline parallelism, pass the memory of all tensor x pipeline GPUs together:
    weights and KV cache split across them, while the runtime overhead is paid once per GPU.
    None for gpu_memory_utilization / max_num_seqs means "vLLM's default" (flag omitted): the
    check then uses the value vLLM will pick (see vllm_batch_defaults) and names it in `vllm_defaults`.
    """
    if gpu_memory_bytes <= 0:
        raise ArchitectureError("gpu_memory_bytes must be positive.")
    if tensor_parallel_size <= 0 or pipeline_parallel_size <= 0:
        raise ArchitectureError("tensor_parallel_size and pipeline_parallel_size must be positive.")
    world_size = tensor_parallel_size * pipeline_parallel_size
    defaults_used: list[str] = []
    if gpu_memory_utilization is None:
        gpu_memory_utilization = VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
        defaults_used.append(
            f"gpu_memory_utilization {VLLM_DEFAULT_GPU_MEMORY_UTILIZATION} "
            "(vLLM's default, vllm/config/cache.py:80)"
        )
    if max_model_len <= 0:
        raise ArchitectureError("max_model_len and max_num_seqs must be positive.")
    batch = vllm_batch_defaults(
        gpu_memory_bytes // world_size,
        gpu_name,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    if max_num_seqs is None:
        defaults_used.append(f"max_num_seqs {batch.max_num_seqs} (vLLM's default for a {batch.rule})")
    if max_num_batched_tokens is None:
        defaults_used.append(
            f"max_num_batched_tokens {batch.max_num_batched_tokens} (vLLM's default for a {batch.rule})"
        )
    max_num_seqs = batch.max_num_seqs
    if not 0 < gpu_memory_utilization <= 1:
        raise ArchitectureError("gpu_memory_utilization must be in (0, 1].")
    if max_model_len <= 0 or max_num_seqs <= 0:
        raise ArchitectureError("max_model_len and max_num_seqs must be positive.")
    est = estimate_memory(architecture, quantization, kv_cache_dtype)
    steps = list(est.steps)
    budget = int(gpu_memory_bytes * gpu_memory_utilization)
    steps.append(
        Step("engine budget", f"{gpu_memory_bytes:,} B x {gpu_memory_utilization} utilization", budget)
    )
    overhead = overhead_bytes * world_size
    overhead_text = f"{overhead_bytes:,} x {world_size} GPUs" if world_size > 1 else f"{overhead_bytes:,}"
    free_for_kv = budget - other_reserved_bytes - est.weight_bytes - overhead
    steps.append(
        Step(
            "left for KV cache",
            f"{budget:,} budget - {other_reserved_bytes:,} reserved by others - {est.weight_bytes:,} weights"
            f" - {overhead_text} runtime overhead (assumed)",
            free_for_kv,
        )
    )
    block_bytes = est.kv_bytes_per_token * KV_BLOCK_TOKENS
    blocks = max(0, free_for_kv) // block_bytes
    kv_tokens = blocks * KV_BLOCK_TOKENS
    steps.append(
        Step(
            "KV cache tokens",
            f"floor({max(0, free_for_kv):,} / ({est.kv_bytes_per_token:,} B x {KV_BLOCK_TOKENS})) blocks"
            f" x {KV_BLOCK_TOKENS} tokens",
            kv_tokens,
            "tokens",
        )
    )
    largest = kv_tokens if max_context is None else min(kv_tokens, max_context)
    model_max = f"{max_context:,}" if max_context is not None else "unknown"
    steps.append(
        Step(
            "largest context that fits",
            f"min({kv_tokens:,} KV tokens, {model_max} model max)",
            largest,
            "tokens",
        )
    )
    full_length = kv_tokens // max_model_len
    steps.append(
        Step(
            "full-length sequences at once",
            f"floor({kv_tokens:,} / {max_model_len:,})",
            full_length,
            "count",
        )
    )

    if free_for_kv <= 0:
        fits = False
        reason = (
            f"Weights ({est.weight_bytes / GIB:.2f} GiB) and overhead do not fit in the "
            f"{budget / GIB:.2f} GiB budget left after other reservations."
        )
    elif max_context is not None and max_model_len > max_context:
        fits = False
        reason = (
            f"max_model_len {max_model_len:,} exceeds the model's maximum context of {max_context:,} tokens."
        )
    elif kv_tokens < max_model_len:
        fits = False
        reason = (
            f"The KV cache holds {kv_tokens:,} tokens, fewer than one sequence of max_model_len "
            f"{max_model_len:,}; lower max_model_len to {largest:,} or free memory."
        )
    else:
        fits = True
        reason = f"Fits: {kv_tokens:,} KV tokens, {full_length:,} full-length sequences at once."
        if full_length < max_num_seqs:
            reason += (
                f" Fewer than max_num_seqs ({max_num_seqs}) can run at full length; the engine will queue"
                " or preempt when long requests pile up."
            )
    return FitResult(
        fits=fits,
        weight_bytes=est.weight_bytes,
        kv_bytes_per_token=est.kv_bytes_per_token,
        kv_tokens_available=kv_tokens,
        max_context_that_fits=largest,
        reason=reason,
        steps=steps,
        full_length_sequences=full_length,
        budget_bytes=budget,
        kv_cache_bytes=blocks * block_bytes,
        parameter_count=est.parameter_count,
        gpu_memory_utilization=gpu_memory_utilization,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=batch.max_num_batched_tokens,
        vllm_defaults=defaults_used,
    )
