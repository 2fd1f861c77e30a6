"""vLLM: the exact `vllm serve` command line and its /metrics.

Flag spellings follow current vLLM (see tests/data/vllm/serve-flags.md): the model is the
positional argument of `serve` (`--model` is deprecated there), booleans are BooleanOptionalAction
pairs, and `--api-key` guards /v1 while /health and /metrics stay open for the agent's probes.
"""

from __future__ import annotations

from nodes.engines.base import EngineSpec
from nodes.engines.metrics import EngineMetrics, parse_vllm_metrics

name = "vllm"
health_path = "/health"
models_path = "/v1/models"
metrics_path: str | None = "/metrics"

# vLLM's in-tree quantization methods (vllm/model_executor/layers/quantization/__init__.py).
# It has no argparse choices, so an unknown value only fails after the model starts loading;
# the console checks it before launch instead.
QUANTIZATION_METHODS = frozenset(
    {
        "awq",
        "auto_awq",
        "fp8",
        "fbgemm_fp8",
        "fp_quant",
        "modelopt",
        "modelopt_fp4",
        "modelopt_mxfp8",
        "modelopt_mixed",
        "auto_gptq",
        "gptq",
        "gptq_marlin",
        "awq_marlin",
        "humming",
        "compressed-tensors",
        "experts_int8",
        "quark",
        "moe_wna16",
        "torchao",
        "inc",
        "mxfp4",
        "gpt_oss_mxfp4",
        "deepseek_v4_fp8",
        "online",
        "fp8_per_tensor",
        "fp8_per_block",
        "fp8_per_channel",
        "int8_per_channel_weight_only",
        "nvfp4_per_token",
        "mxfp8",
    }
)
# These need --allow-deprecated-quantization, which the adapter adds.
DEPRECATED_QUANTIZATION_METHODS = frozenset({"fbgemm_fp8", "fp_quant"})
KV_CACHE_DTYPES = frozenset(
    {
        "auto",
        "bfloat16",
        "float16",
        "fp8",
        "fp8_ds_mla",
        "fp8_e4m3",
        "fp8_e5m2",
        "fp8_inc",
        "fp8_per_token_head",
        "int4_per_token_head",
        "int8_per_token_head",
        "nvfp4",
        "nvfp4_4over6",
        "turboquant_3bit_nc",
        "turboquant_4bit_nc",
        "turboquant_k3v4_nc",
        "turboquant_k8v4",
    }
)
DTYPES = frozenset({"auto", "bfloat16", "float", "float16", "float32", "half"})


def serve_flags(spec: EngineSpec) -> list[str]:
    """The `vllm serve` options for `spec`, shared with the simulator (which takes the same flags)."""
    argv = [
        "--host",
        spec.bind_host,
        "--port",
        str(spec.port),
        "--served-model-name",
        spec.served_model_name,
        "--api-key",
        spec.api_key,
        "--gpu-memory-utilization",
        repr(float(spec.gpu_memory_utilization)),
        "--max-model-len",
        str(spec.max_model_len),
        "--block-size",
        str(spec.block_size),
        "--max-num-seqs",
        str(spec.max_num_seqs),
        "--tensor-parallel-size",
        str(spec.tensor_parallel_size),
        "--enable-prefix-caching" if spec.enable_prefix_caching else "--no-enable-prefix-caching",
    ]
    if spec.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(spec.max_num_batched_tokens)]
    if spec.quantization_method:
        argv += ["--quantization", spec.quantization_method]
        if spec.quantization_method in DEPRECATED_QUANTIZATION_METHODS:
            argv.append("--allow-deprecated-quantization")
    if spec.kv_cache_dtype and spec.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", spec.kv_cache_dtype]
    if spec.dtype and spec.dtype != "auto":
        argv += ["--dtype", spec.dtype]
    if spec.tokenizer_path:
        argv += ["--tokenizer", spec.tokenizer_path]
    return argv


def build_argv(spec: EngineSpec) -> list[str]:
    # `python -m vllm.entrypoints.cli.main` is what the `vllm` console script runs; calling it through
    # the node's interpreter avoids depending on PATH inside the agent's environment.
    return [
        spec.python,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        spec.model_path,
        *serve_flags(spec),
        # The per-request stats log would fill the engine log; the console reads /metrics instead.
        "--disable-log-stats",
        "--disable-uvicorn-access-log",
        *spec.extra_args,
    ]


def build_env(spec: EngineSpec) -> dict[str, str]:
    env = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    if spec.gpu_indices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in spec.gpu_indices)
    return env


def parse_metrics(text: str) -> EngineMetrics:
    return parse_vllm_metrics(text)
