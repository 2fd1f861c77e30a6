"""Hardware and model profiles of the vLLM simulator, and the arithmetic that turns them into a KV cache.

Every number here is a public datasheet figure (GPU memory, bandwidth, dense tensor FLOPS, board power)
or a model-config figure (layers, KV heads, head size, parameter count), except the efficiency factors,
which are the usual fractions a serving engine reaches; docs/simulator.md gives the sources and the
reasoning for each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 1024**3
MIB = 1024**2
# Pipeline stages hand each micro-batch's hidden states to the next stage: NCCL send/recv, across hosts
# over the network. Assumed: 30 us per hand-off plus the bytes at 100 Gb/s (12.5 GB/s).
PP_SEND_LATENCY_S = 30e-6
PP_SEND_BANDWIDTH = 12.5e9


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator model: what nvidia-smi reports and what the datasheet promises."""

    name: str
    memory_bytes: int
    mem_bandwidth: float  # bytes/s (HBM or GDDR peak)
    dense_flops: float  # FLOP/s, dense fp16/bf16 tensor-core peak
    power_max_watts: float  # board power limit
    power_idle_watts: float
    # nvidia-smi on an A100 is what vLLM's get_batch_defaults() special-cases (arg_utils.py:2566-2657).
    is_a100: bool = False
    # Host-to-device copy rate from pinned memory (what a level-1 wake-up moves the weights at): about
    # 80 % of the PCIe link's 16 GT/s x16 (Gen4, 31.5 GB/s) or 32 GT/s x16 (Gen5, 63 GB/s) per direction.
    host_link_bandwidth: float = 25e9


@dataclass(frozen=True)
class ModelSpec:
    """The shape of one model checkpoint as stored (the weight format is part of the checkpoint)."""

    name: str
    params: float  # parameter count
    weight_bytes: int  # bytes of the checkpoint's weights as loaded on the GPU(s)
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    dtype_bytes: int  # activations / KV cache element size with kv-cache-dtype=auto
    quantization: str | None  # the method vLLM would read from the checkpoint's quantization_config


@dataclass(frozen=True)
class Profile:
    """A named GPU + model pairing with the efficiency factors that the time model uses."""

    name: str
    gpu: GPUSpec
    model: ModelSpec
    bandwidth_efficiency: float  # achieved fraction of peak memory bandwidth in decode
    mfu: float  # achieved fraction of peak FLOPS for dense matmuls (prefill, large batches)
    step_overhead_s: float  # CPU/launch cost per engine step (scheduling, sampling, CUDA graph replay)
    per_seq_overhead_s: float  # extra CPU per sequence in a step (sampling, detokenizing)
    allreduce_latency_s: float  # one tensor-parallel all-reduce (two per layer per step)
    non_torch_bytes: int  # CUDA context, NCCL buffers, CUDA graphs: memory vLLM cannot give to the KV cache
    recommended_tp: int  # the tensor-parallel size this pairing is normally run with
    description: str


H100_SXM = GPUSpec(
    name="NVIDIA H100 80GB HBM3",
    memory_bytes=81559 * MIB,
    mem_bandwidth=3.35e12,
    dense_flops=989e12,
    power_max_watts=700.0,
    power_idle_watts=70.0,
    host_link_bandwidth=50e9,  # PCIe Gen5 x16
)
A100_SXM_80 = GPUSpec(
    name="NVIDIA A100-SXM4-80GB",
    memory_bytes=81920 * MIB,
    mem_bandwidth=2.039e12,
    dense_flops=312e12,
    power_max_watts=400.0,
    power_idle_watts=55.0,
    is_a100=True,
)
A10 = GPUSpec(
    name="NVIDIA A10",
    memory_bytes=23028 * MIB,
    mem_bandwidth=600e9,
    dense_flops=125e12,
    power_max_watts=150.0,
    power_idle_watts=18.0,
)

LLAMA3_8B_BF16 = ModelSpec(
    name="meta-llama/Llama-3.1-8B-Instruct",
    params=8.03e9,
    weight_bytes=16_060_000_000,
    num_layers=32,
    hidden_size=4096,
    intermediate_size=14336,
    num_kv_heads=8,
    head_dim=128,
    vocab_size=128256,
    max_position_embeddings=131072,
    dtype_bytes=2,
    quantization=None,
)
# AWQ 4-bit (group size 128): linear layers at ~4.25 bits, embeddings and lm_head stay in fp16.
LLAMA3_8B_AWQ = ModelSpec(
    name="hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4",
    params=8.03e9,
    weight_bytes=5_730_000_000,
    num_layers=32,
    hidden_size=4096,
    intermediate_size=14336,
    num_kv_heads=8,
    head_dim=128,
    vocab_size=128256,
    max_position_embeddings=131072,
    dtype_bytes=2,
    quantization="awq_marlin",
)
LLAMA3_70B_BF16 = ModelSpec(
    name="meta-llama/Llama-3.1-70B-Instruct",
    params=70.6e9,
    weight_bytes=141_100_000_000,
    num_layers=80,
    hidden_size=8192,
    intermediate_size=28672,
    num_kv_heads=8,
    head_dim=128,
    vocab_size=128256,
    max_position_embeddings=131072,
    dtype_bytes=2,
    quantization=None,
)

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            name="h100-llama3-8b-fp16",
            gpu=H100_SXM,
            model=LLAMA3_8B_BF16,
            bandwidth_efficiency=0.80,
            mfu=0.45,
            step_overhead_s=0.0015,
            per_seq_overhead_s=4e-6,
            allreduce_latency_s=8e-6,
            non_torch_bytes=int(1.5 * GIB),
            recommended_tp=1,
            description="One H100 SXM 80GB serving Llama-3.1-8B in bf16.",
        ),
        Profile(
            name="a10-llama3-8b-int4",
            gpu=A10,
            model=LLAMA3_8B_AWQ,
            bandwidth_efficiency=0.75,
            mfu=0.35,
            step_overhead_s=0.002,
            per_seq_overhead_s=5e-6,
            allreduce_latency_s=15e-6,
            non_torch_bytes=int(0.9 * GIB),
            recommended_tp=1,
            description="One A10 24GB serving Llama-3.1-8B quantized to 4-bit AWQ (Marlin kernels).",
        ),
        Profile(
            name="a100-llama3-70b-fp16",
            gpu=A100_SXM_80,
            model=LLAMA3_70B_BF16,
            bandwidth_efficiency=0.80,
            mfu=0.50,
            step_overhead_s=0.002,
            per_seq_overhead_s=4e-6,
            allreduce_latency_s=10e-6,
            non_torch_bytes=int(2.0 * GIB),
            recommended_tp=4,
            description="Four A100 SXM 80GB (NVLink, tensor parallel 4) serving Llama-3.1-70B in bf16.",
        ),
    )
}
DEFAULT_PROFILE = "h100-llama3-8b-fp16"

_KV_DTYPE_BYTES = {"auto": 0, "bfloat16": 2, "float16": 2}


class EngineConfigError(ValueError):
    """The engine cannot start with this configuration (vLLM raises at start-up and exits)."""


def kv_dtype_bytes(kv_cache_dtype: str, model: ModelSpec) -> float:
    """Bytes per KV element: the model dtype for auto, 1 for the fp8/int8 formats, 0.5 for 4-bit ones."""
    if kv_cache_dtype in _KV_DTYPE_BYTES:
        return _KV_DTYPE_BYTES[kv_cache_dtype] or model.dtype_bytes
    if kv_cache_dtype.startswith(("nvfp4", "int4")):
        return 0.5
    if kv_cache_dtype.startswith("turboquant_3bit"):
        return 0.375
    return 1.0


@dataclass(frozen=True)
class EngineShape:
    """What the simulated engine derives at start-up: batch limits and the KV cache it can allocate."""

    profile: Profile
    tensor_parallel_size: int
    block_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    kv_cache_dtype: str
    kv_bytes_per_token_per_gpu: float
    weight_bytes_per_gpu: int
    activation_bytes_per_gpu: int
    kv_cache_bytes_per_gpu: int
    num_gpu_blocks: int
    # Stages of the pipeline; each holds ceil(layers / PP) layers (and their KV cache) on its TP GPUs.
    pipeline_parallel_size: int = 1

    @property
    def world_size(self) -> int:
        """GPUs of one engine core: tensor x pipeline parallel."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def kv_cache_size_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    @property
    def kv_cache_max_concurrency(self) -> float:
        return self.kv_cache_size_tokens / self.max_model_len

    @property
    def memory_used_bytes_per_gpu(self) -> int:
        # vLLM pre-allocates the whole KV cache, so nvidia-smi shows this much from start-up on.
        return (
            self.weight_bytes_per_gpu
            + self.activation_bytes_per_gpu
            + self.profile.non_torch_bytes
            + self.kv_cache_bytes_per_gpu
        )


def batch_defaults(gpu: GPUSpec) -> tuple[int, int]:
    """vLLM's get_batch_defaults() for the API server: (max_num_seqs, max_num_batched_tokens)."""
    gib = gpu.memory_bytes / GIB
    if gib >= 160:
        return 1024, 16384
    if gib >= 70 and not gpu.is_a100:
        return 1024, 8192
    return 256, 2048


def derive_engine_shape(
    profile: Profile,
    *,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    block_size: int = 16,
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    gpu_memory_utilization: float = 0.92,
    kv_cache_dtype: str = "auto",
    num_gpu_blocks_override: int | None = None,
) -> EngineShape:
    """Size the KV cache the way vLLM does: budget = total * utilization - weights - activations - other.

    Raises EngineConfigError with vLLM's wording when the weights do not fit or the KV cache cannot hold
    one request of max_model_len tokens.
    """
    model = profile.model
    gpu = profile.gpu
    tp = tensor_parallel_size
    pp = pipeline_parallel_size
    if pp < 1 or pp > model.num_layers:
        raise EngineConfigError(
            f"pipeline_parallel_size ({pp}) must be between 1 and the model's "
            f"{model.num_layers} hidden layers."
        )
    # vLLM gives each stage num_layers // PP layers and spreads the remainder over the stages before the
    # last (get_pp_indices, vllm/distributed/utils.py): the largest stage holds ceil(layers / PP).
    stage_layers = math.ceil(model.num_layers / pp)
    if model.num_kv_heads % tp and tp % model.num_kv_heads:
        raise EngineConfigError(
            f"Total number of attention heads ({model.hidden_size // model.head_dim}) must be divisible by "
            f"tensor parallel size ({tp})."
        )
    default_seqs, default_tokens = batch_defaults(gpu)
    seqs = max_num_seqs or default_seqs
    derived_len = model.max_position_embeddings
    if max_model_len is not None and max_model_len > derived_len:
        raise EngineConfigError(
            f"User-specified max_model_len ({max_model_len}) is greater than the derived max_model_len "
            f"(max_position_embeddings={derived_len} or model_max_length=None in model's config.json)."
        )
    mml = max_model_len or derived_len
    tokens = max_num_batched_tokens or default_tokens
    seqs = min(seqs, tokens)
    # KV heads are split across ranks; with more ranks than KV heads each rank keeps a replica.
    kv_heads_per_gpu = max(1, model.num_kv_heads // tp)
    kv_per_token = (
        2 * stage_layers * kv_heads_per_gpu * model.head_dim * kv_dtype_bytes(kv_cache_dtype, model)
    )
    weights = math.ceil(model.weight_bytes * stage_layers / model.num_layers / tp)
    # Peak activations of the profiling forward pass: max_num_batched_tokens through one layer (hidden
    # states, QKV, MLP intermediates) plus the sampler's fp32 logits for max_num_seqs rows.
    act_per_token = (model.hidden_size * 12 + model.intermediate_size * 4) * model.dtype_bytes / tp
    activations = int(tokens * act_per_token + seqs * model.vocab_size * 4)
    budget = gpu.memory_bytes * gpu_memory_utilization
    kv_bytes = int(budget - weights - activations - profile.non_torch_bytes)
    if weights + profile.non_torch_bytes > gpu.memory_bytes:
        raise EngineConfigError(
            f"CUDA out of memory. Tried to load {weights / GIB:.2f} GiB of weights per GPU on a GPU with "
            f"{gpu.memory_bytes / GIB:.2f} GiB total capacity (tensor_parallel_size={tp}, "
            f"pipeline_parallel_size={pp}; this profile is "
            f"normally run with --tensor-parallel-size {profile.recommended_tp})."
        )
    if kv_bytes <= 0:
        raise EngineConfigError(
            "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
            "initializing the engine."
        )
    blocks = num_gpu_blocks_override or int(kv_bytes // (kv_per_token * block_size))
    kv_bytes = int(blocks * kv_per_token * block_size)
    if blocks * block_size < mml:
        estimated = blocks * block_size
        raise EngineConfigError(
            f"To serve at least one request with the models's max seq len ({mml}), "
            f"({mml * kv_per_token / GIB:.2f} GiB KV cache is needed, which is larger than the available "
            f"KV cache memory ({kv_bytes / GIB:.2f} GiB). Based on the available memory, the estimated "
            f"maximum model length is {estimated}. Try increasing `gpu_memory_utilization` or decreasing "
            "`max_model_len` when initializing the engine."
        )
    return EngineShape(
        profile=profile,
        tensor_parallel_size=tp,
        block_size=block_size,
        max_model_len=mml,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        gpu_memory_utilization=gpu_memory_utilization,
        kv_cache_dtype=kv_cache_dtype,
        kv_bytes_per_token_per_gpu=kv_per_token,
        weight_bytes_per_gpu=weights,
        activation_bytes_per_gpu=activations,
        kv_cache_bytes_per_gpu=kv_bytes,
        num_gpu_blocks=blocks,
        pipeline_parallel_size=pp,
    )


def step_time_s(
    shape: EngineShape,
    *,
    num_tokens: int,
    num_seqs: int,
    context_tokens: int,
    attention_pairs: float,
) -> float:
    """Modelled duration of one engine step (one forward pass over the scheduled tokens).

    A forward pass must stream every weight and the attended KV cache from memory once, and must do
    2 * params FLOPs per token plus attention FLOPs; it takes the longer of the two (roofline), plus
    a fixed CPU/launch overhead and, with tensor parallelism, two all-reduces per layer.

    With pipeline parallelism the step is that roofline per stage (its layers, its share of the KV
    cache) for each of up to PP micro-batches, passed stage to stage: every scheduled sequence moves
    one step after PP stage times plus PP-1 hand-offs. With fewer sequences than stages the pipeline
    has bubbles: the stages idle while a lone micro-batch is elsewhere (pipeline_occupancy).

    num_tokens: tokens computed this step (1 per decoding sequence + prefill chunk tokens).
    context_tokens: KV entries read (the sum of the context lengths of the scheduled sequences).
    attention_pairs: query x key pairs computed (for prefill chunks this grows with the square of length).
    """
    p = shape.profile
    m = p.model
    tp = shape.tensor_parallel_size
    pp = shape.pipeline_parallel_size
    if num_tokens <= 0:
        return 0.0
    micro = min(pp, max(1, num_seqs))
    tokens, seqs = num_tokens / micro, num_seqs / micro
    bytes_moved = shape.weight_bytes_per_gpu + context_tokens / micro * shape.kv_bytes_per_token_per_gpu
    t_mem = bytes_moved / (p.gpu.mem_bandwidth * p.bandwidth_efficiency)
    attn_flops = 4.0 * m.num_layers * m.hidden_size * attention_pairs / micro
    flops = (2.0 * m.params * tokens + attn_flops) / tp / pp
    t_compute = flops / (p.gpu.dense_flops * p.mfu)
    layers = math.ceil(m.num_layers / pp)
    t_comm = 2 * layers * p.allreduce_latency_s if tp > 1 else 0.0
    # Scheduling and sampling happen once per micro-batch, on the driver; the GPU work once per stage.
    t_cpu = p.step_overhead_s + seqs * p.per_seq_overhead_s
    t_stage = max(t_mem, t_compute) + t_comm
    if pp == 1:
        return t_cpu + t_stage
    # Hidden states and residual of the micro-batch sent to the next stage (across hosts: the network).
    handoff = PP_SEND_LATENCY_S + 2 * tokens * m.hidden_size * m.dtype_bytes / PP_SEND_BANDWIDTH
    return t_cpu + pp * t_stage + (pp - 1) * handoff


def pipeline_occupancy(shape: EngineShape, num_seqs: int) -> float:
    """Fraction of the step each pipeline stage computes: micro-batches in flight / stages."""
    pp = shape.pipeline_parallel_size
    return min(pp, max(1, num_seqs)) / pp


def knee_tokens(shape: EngineShape) -> float:
    """Tokens per step at which a step stops being memory-bound and becomes compute-bound."""
    p = shape.profile
    t_mem = shape.weight_bytes_per_gpu / (p.gpu.mem_bandwidth * p.bandwidth_efficiency)
    t_per_token = 2.0 * p.model.params / shape.world_size / (p.gpu.dense_flops * p.mfu)
    return t_mem / t_per_token


# Sleep mode (docs/simulator.md, "Sleep mode"): what a wake-up costs. Level 1 copies the weights back
# from pinned host memory over the GPU's host link; level 2 first reads them again from the host's
# page cache (safetensors, single-threaded loader) and then copies them. Both remap the memory pool
# and the KV cache first (WAKE_FIXED_S).
WAKE_FIXED_S = 0.05
RELOAD_READ_BANDWIDTH = 5e9  # bytes/s: reading safetensors back from the page cache


def wake_time_s(shape: EngineShape, level: int, tags: frozenset[str]) -> float:
    """Modelled seconds a /wake_up of `tags` takes after a sleep at `level` (0 when nothing sleeps)."""
    if not tags:
        return 0.0
    seconds = WAKE_FIXED_S
    if "weights" in tags:
        weights = shape.weight_bytes_per_gpu
        seconds += weights / shape.profile.gpu.host_link_bandwidth
        if level >= 2:
            seconds += weights / RELOAD_READ_BANDWIDTH
    return seconds
