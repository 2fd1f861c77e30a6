"""vLLM: the exact `vllm serve` command line and its /metrics.

Flag spellings follow current vLLM (see tests/data/vllm/serve-flags.md): the model is the
positional argument of `serve` (`--model` is deprecated there), booleans are BooleanOptionalAction
pairs. The engine key is passed as `VLLM_API_KEY` (never in argv) and `--middleware` loads
nodes/engines/guard.py, which requires it on every path but `GET /health` (vLLM's `--api-key` alone
guards only /v1, /v2, /inference and /cohere).
"""

from __future__ import annotations

import re

from nodes.engines import guard
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
    """The `vllm serve` options for `spec`, shared with the simulator (which takes the same flags).

    Only what the console must own (address, key, name, context, parallelism) or what the admin
    set is passed: every omitted flag is vLLM's own default, and a passed one counts as user-set
    (e.g. `--block-size` overrides the attention backend's preferred size,
    vllm/platforms/interface.py:628-641; `--quantization awq` keeps the slow AWQ kernel instead of
    Marlin, awq_marlin.py override_quantization_method). See docs/deploying.md, "Launch arguments".
    """
    argv = [
        "--host",
        spec.bind_host,
        "--port",
        str(spec.port),
        "--served-model-name",
        spec.served_model_name,
        # Every path needs the engine key (VLLM_API_KEY in build_env), not only /v1: see guard.py.
        "--middleware",
        guard.IMPORT_PATH,
        "--max-model-len",
        str(spec.max_model_len),
        "--tensor-parallel-size",
        str(spec.tensor_parallel_size),
        "--enable-prefix-caching" if spec.enable_prefix_caching else "--no-enable-prefix-caching",
    ]
    if spec.enable_sleep_mode:
        # The agent sleeps and wakes it through the dev endpoints (VLLM_SERVER_DEV_MODE in build_env).
        argv.append("--enable-sleep-mode")
    if spec.pipeline_parallel_size != 1:
        argv += ["--pipeline-parallel-size", str(spec.pipeline_parallel_size)]
    if spec.distributed_executor_backend:
        # Across hosts vLLM runs its workers as Ray actors on the cluster the agents started
        # (docs/serving/parallelism_scaling.md, "Running vLLM on a Ray cluster"), or, with "mp", as
        # processes of each host's own `vllm serve` ("Running vLLM with MultiProcessing").
        argv += ["--distributed-executor-backend", spec.distributed_executor_backend]
    if spec.nnodes > 1:
        # vllm/engine/arg_utils.py:1025-1028 (ParallelConfig, vllm/config/parallel.py:270-281): every
        # node names the node count, its rank and the head's address and port, where the workers of
        # all nodes form one torch.distributed group; ranks > 0 run no API server (--headless).
        argv += ["--nnodes", str(spec.nnodes), "--node-rank", str(spec.node_rank)]
        argv += ["--master-addr", str(spec.master_addr), "--master-port", str(spec.master_port)]
        if spec.headless:
            argv.append("--headless")
    if spec.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", repr(float(spec.gpu_memory_utilization))]
    if spec.block_size is not None:
        argv += ["--block-size", str(spec.block_size)]
    if spec.max_num_seqs is not None:
        argv += ["--max-num-seqs", str(spec.max_num_seqs)]
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
    # No `--disable-log-stats`: vLLM refuses it together with `--enable-per-request-metrics`
    # (cli_args.py:429-435), which an admin may want; the periodic stats line is one line per interval.
    return [
        spec.python,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        spec.model_path,
        *serve_flags(spec),
        # One log line per HTTP request (the console's probes included) would bury the engine's log.
        "--disable-uvicorn-access-log",
        *spec.extra_args,
    ]


# --- extra_args: the flags tests/data/vllm/serve-flags.md lists ---------------------------------

# Flag -> True if it takes a value. Spellings as `vllm serve --help` prints them (vLLM @ 2f41c894;
# tests/nodes/test_vllm_extra_args.py checks this table against the vendored reference). Bool
# dataclass fields are BooleanOptionalAction (arg_utils.py:352-354), so `--no-<flag>` exists too.
_VALUE = True
_BOOL = False
SERVE_FLAGS: dict[str, bool] = {
    "--host": _VALUE,
    "--port": _VALUE,
    "--api-key": _VALUE,
    "--served-model-name": _VALUE,
    "--model": _VALUE,
    "--quantization": _VALUE,
    "--dtype": _VALUE,
    "--kv-cache-dtype": _VALUE,
    "--gpu-memory-utilization": _VALUE,
    "--max-model-len": _VALUE,
    "--block-size": _VALUE,
    "--max-num-seqs": _VALUE,
    "--max-num-batched-tokens": _VALUE,
    "--tensor-parallel-size": _VALUE,
    "--pipeline-parallel-size": _VALUE,
    "--enable-prefix-caching": _BOOL,
    "--enable-chunked-prefill": _BOOL,
    "--enforce-eager": _BOOL,
    "--max-logprobs": _VALUE,
    "--enable-sleep-mode": _BOOL,
    "--enable-lora": _BOOL,
    "--load-format": _VALUE,
    "--trust-remote-code": _BOOL,
    "--generation-config": _VALUE,
    "--enable-log-requests": _BOOL,
    "--disable-log-stats": _BOOL,
    "--api-server-count": _VALUE,
    "--headless": _BOOL,
    "--config": _VALUE,
    "--grpc": _BOOL,
    "--uds": _VALUE,
    "--root-path": _VALUE,
    "--ssl-keyfile": _VALUE,
    "--ssl-certfile": _VALUE,
    "--ssl-ca-certs": _VALUE,
    "--ssl-cert-reqs": _VALUE,
    "--ssl-ciphers": _VALUE,
    "--enable-ssl-refresh": _BOOL,
    "--allowed-origins": _VALUE,
    "--allowed-methods": _VALUE,
    "--allowed-headers": _VALUE,
    "--allow-credentials": _BOOL,
    "--uvicorn-log-level": _VALUE,
    "--disable-uvicorn-access-log": _BOOL,
    "--disable-access-log-for-endpoints": _VALUE,
    "--disable-fastapi-docs": _BOOL,
    "--enable-request-id-headers": _BOOL,
    "--middleware": _VALUE,
    "--lora-modules": _VALUE,
    "--chat-template": _VALUE,
    "--enable-auto-tool-choice": _BOOL,
    "--tool-call-parser": _VALUE,
    "--reasoning-parser": _VALUE,
    "--max-log-len": _VALUE,
    "--enable-tokenizer-info-endpoint": _BOOL,
    "--enable-log-outputs": _BOOL,
    "--log-error-stack": _BOOL,
    "--seed": _VALUE,
    "--tokenizer": _VALUE,
    "--revision": _VALUE,
    "--download-dir": _VALUE,
    "--hf-overrides": _VALUE,
    "--data-parallel-size": _VALUE,
    "--enable-expert-parallel": _BOOL,
    "--distributed-executor-backend": _VALUE,
    "--kv-cache-memory-bytes": _VALUE,
    "--prefix-caching-hash-algo": _VALUE,
    "--cpu-offload-gb": _VALUE,
    "--scheduling-policy": _VALUE,
    "--async-scheduling": _BOOL,
    "--max-loras": _VALUE,
    "--max-lora-rank": _VALUE,
    "--speculative-config": _VALUE,
    "--compilation-config": _VALUE,
    "--optimization-level": _VALUE,
    "--performance-mode": _VALUE,
    "--show-hidden-metrics-for-version": _VALUE,
    "--kv-transfer-config": _VALUE,
    "--shutdown-timeout": _VALUE,
    "--enable-per-request-metrics": _BOOL,
    "--allow-deprecated-quantization": _BOOL,
}
SHORT_FLAGS = {
    "-q": "--quantization",
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-dp": "--data-parallel-size",
    "-ep": "--enable-expert-parallel",
    "-asc": "--api-server-count",
    "-sc": "--speculative-config",
    "-cc": "--compilation-config",
}
# store_true flags: no `--no-` form.
_STORE_TRUE = frozenset({"--disable-log-stats", "--headless", "--grpc", "--allow-deprecated-quantization"})
# Flags vLLM removed: argparse refuses them ("unrecognized arguments"), with the PR that did it.
REMOVED_FLAGS = {
    "--swap-space": "removed from vLLM by PR #36216 (2026-03-07)",
    "--disable-log-requests": "removed from vLLM by PR #35723 (2026-03-03); request logs are off by default",
}
# Flags the deployment's own fields set: giving them again in extra_args would contradict the form.
OWNED_FLAGS = {
    "--host": "the console sets the address",
    "--port": "set it in the port field",
    "--api-key": "the console sets the per-deployment engine key",
    "--served-model-name": "the console serves under the alias name",
    "--model": "the model is the version's path",
    "--tokenizer": "the tokenizer is the version's",
    "--quantization": "set it in the quantization_override field",
    "--dtype": "the quantization config sets it",
    "--kv-cache-dtype": "the quantization config sets it",
    "--gpu-memory-utilization": "set it in the gpu_memory_utilization field",
    "--max-model-len": "set it in the max_model_len field",
    "--block-size": "set it in the block_size field",
    "--max-num-seqs": "set it in the max_num_seqs field",
    "--max-num-batched-tokens": "set it in the max_num_batched_tokens field",
    "--tensor-parallel-size": "set it in the tensor_parallel_size field",
    "--pipeline-parallel-size": "set it in the pipeline_parallel_size field",
    "--enable-prefix-caching": "set it in the enable_prefix_caching field",
    "--enable-sleep-mode": "set it in the sleep_enabled field (the agent needs the dev endpoints with it)",
    "--disable-uvicorn-access-log": "the console always passes it",
    "--config": "a config file could override every console-owned flag",
    "--uds": "the console reaches engines over host:port",
    "--headless": "a headless engine has no API server to probe",
    "--data-parallel-size": "the console places tensor x pipeline GPUs only",
}


def _canonical(token: str) -> str | None:
    """The long flag a token names (FlexibleArgumentParser accepts `_` for `-`, argparse_utils.py:301-320),
    or None when the token is a value (negative numbers included)."""
    name = token.split("=", 1)[0]
    if name in SHORT_FLAGS:
        return SHORT_FLAGS[name]
    if name.startswith("-O") and len(name) > 2 and not name.startswith("--"):
        return "--optimization-level"
    if not name.startswith("--"):
        return None
    # `--json-arg.key value` sets one key of a JSON flag (argparse_utils.py).
    return "--" + name[2:].split(".", 1)[0].replace("_", "-")


def check_extra_args(args: list[str] | tuple[str, ...], *, allow_prefix: str | None = None) -> list[str]:
    """Why `args` would make `vllm serve` refuse to start or contradict the form: one reason per problem.

    Unknown flags are refused because vLLM's parser refuses them (cli/main.py:92 uses parse_args);
    "known" means listed in tests/data/vllm/serve-flags.md. `allow_prefix` lets the simulator's own
    `--sim-*` options through.
    """
    problems: list[str] = []
    seen: dict[str, str] = {}
    for index, token in enumerate(args):
        flag = _canonical(token)
        if flag is None:
            # A value (some flags take several: nargs="+"); only a leading one belongs to no flag.
            if index == 0:
                problems.append(f"{token!r} is not a flag; extra_args are `--flag value` pairs.")
            continue
        if allow_prefix and token.startswith(allow_prefix):
            continue
        base = flag
        negated = False
        if flag.startswith("--no-") and flag not in SERVE_FLAGS:
            base = "--" + flag[len("--no-") :]
            negated = True
        if base in REMOVED_FLAGS:
            problems.append(f"{base} is {REMOVED_FLAGS[base]}.")
            continue
        if base not in SERVE_FLAGS or (negated and (SERVE_FLAGS[base] or base in _STORE_TRUE)):
            problems.append(f"vLLM has no flag {flag} (not a `vllm serve` flag docs/deploying.md lists).")
            continue
        if base in OWNED_FLAGS:
            problems.append(f"{base} conflicts with the deployment's settings: {OWNED_FLAGS[base]}.")
            continue
        if base in seen:
            problems.append(f"{base} is given twice.")
        seen[base] = "no" if negated else "yes"
    if seen.get("--disable-log-stats") == "yes" and seen.get("--enable-per-request-metrics") == "yes":
        problems.append(
            "--disable-log-stats and --enable-per-request-metrics cannot be combined "
            "(vLLM raises ValueError, cli_args.py:429-435)."
        )
    if seen.get("--enable-log-outputs") == "yes" and seen.get("--enable-log-requests") != "yes":
        problems.append("--enable-log-outputs requires --enable-log-requests (cli_args.py:426-427).")
    if seen.get("--enable-auto-tool-choice") == "yes" and "--tool-call-parser" not in seen:
        problems.append("--enable-auto-tool-choice requires --tool-call-parser (cli_args.py:424-425).")
    return problems


# --- what the engine says about its quantization kernel -----------------------------------------

# What the engine's log says about its AWQ/GPTQ kernel. At vLLM 2f41c894 the AutoAWQ/AutoGPTQ linear
# methods log the kernel they chose for the checkpoint ("Using MarlinLinearKernel for
# AutoAWQMarlinLinearMethod", model_executor/layers/quantization/auto_awq.py:447-449, auto_gptq.py:356-358)
# and warn when a layer falls back to the unoptimized AWQ kernels (auto_awq.py:322-326). Releases before
# PR #42727 (AWQ, 2026-06-18) and PR #38288 (GPTQ, 2026-05-14) logged the Marlin upgrade or an explicit
# method kept from override_quantization_method in awq_marlin.py / gptq_marlin.py; both forms are read.
_CONVERTIBLE = re.compile(r"The model is convertible to (\S+) during runtime\. Using \S+ kernel\.")
_FORCED = re.compile(
    r"Detected that the model can run with (\S+), however you specified quantization=(\S+) explicitly"
)
_CHOSEN = re.compile(r"Using (\S+) for Auto(AWQ|GPTQ)\w*LinearMethod")
_FALLBACK = re.compile(r"is not supported by AutoAWQMarlin\. Falling back to unoptimized AWQ kernels")


def reported_quantization_kernel(log_text: str) -> str | None:
    """The quantization kernel the engine's log names (last start wins), e.g. "auto_awq (MarlinLinearKernel)"
    or, from older vLLM, "awq_marlin"; None when the log names none.

    A forced slow kernel reads "awq (awq_marlin available)"; a layer falling back to the unoptimized AWQ
    kernels adds " + AWQ fallback" (the stored field holds 64 characters).
    """
    found: str | None = None
    for line in log_text.splitlines():
        match = _CONVERTIBLE.search(line)
        if match:
            found = match.group(1)
            continue
        forced = _FORCED.search(line)
        if forced:
            found = f"{forced.group(2)} ({forced.group(1)} available)"
            continue
        chosen = _CHOSEN.search(line)
        if chosen:
            found = f"auto_{chosen.group(2).lower()} ({chosen.group(1)})"
            continue
        if _FALLBACK.search(line) and found is not None and "fallback" not in found:
            found += " + AWQ fallback"
    return found


def build_env(spec: EngineSpec) -> dict[str, str]:
    # The key goes in the environment, which vLLM reads when --api-key is absent
    # (serve/middleware/register.py:32-36): a command line is readable by every user of the host (`ps`).
    env = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    if not spec.headless:
        # A headless node serves no API, so the key does not travel to its host.
        env[guard.KEY_ENV] = spec.api_key
    if spec.enable_sleep_mode:
        # /sleep, /wake_up and /is_sleeping exist only in dev mode; the key guard covers them too.
        env["VLLM_SERVER_DEV_MODE"] = "1"
    if spec.gpu_indices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in spec.gpu_indices)
    if spec.ray_address:
        # ray.init() inside vLLM joins this cluster (RAY_ADDRESS), and VLLM_HOST_IP is the address this
        # node is known by in it, as vLLM's multi-node docs ask for each node.
        env["RAY_ADDRESS"] = spec.ray_address
    if spec.node_ip:
        env["VLLM_HOST_IP"] = spec.node_ip
    return env


def parse_metrics(text: str) -> EngineMetrics:
    return parse_vllm_metrics(text)
