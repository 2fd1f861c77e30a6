"""Command line of the simulator: `python -m vllm_sim serve MODEL [vLLM flags] [--sim-* knobs]`.

The parser accepts the `vllm serve` flags a deployment would pass (names and types per
tests/data/vllm/serve-flags.md), with vLLM's parser habits: `_` and `-` are interchangeable
in flag names, `--model X` is rewritten to the positional, unknown flags are an argparse error (exit 2).
Flags the simulator does not model are accepted and ignored (IGNORED_VALUE_FLAGS, IGNORED_BOOL_FLAGS).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping

from vllm_sim.profiles import DEFAULT_PROFILE, PROFILES

DTYPES = ["auto", "bfloat16", "float", "float16", "float32", "half"]
# vLLM's `CacheDType` (vllm/config/cache.py:19-37, tests/data/vllm/serve-flags.md). The simulator keeps its
# own copy, as it keeps every flag it parses: it imports nothing of the product (pyproject's contracts).
KV_CACHE_DTYPES = [
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
]

# vLLM flags taking a value that change nothing in the simulation.
IGNORED_VALUE_FLAGS = [
    "--tokenizer",
    "--revision",
    "--code-revision",
    "--tokenizer-revision",
    "--download-dir",
    "--load-format",
    "--chat-template",
    "--tool-call-parser",
    "--reasoning-parser",
    "--max-log-len",
    "--generation-config",
    "--hf-overrides",
    "--distributed-executor-backend",
    "--kv-cache-memory-bytes",
    "--prefix-caching-hash-algo",
    "--cpu-offload-gb",
    "--scheduling-policy",
    "--max-loras",
    "--max-lora-rank",
    "--speculative-config",
    "--compilation-config",
    "--optimization-level",
    "--performance-mode",
    "--show-hidden-metrics-for-version",
    "--kv-transfer-config",
    "--shutdown-timeout",
    "--uvicorn-log-level",
    "--root-path",
    "--ssl-keyfile",
    "--ssl-certfile",
    "--ssl-ca-certs",
    "--ssl-cert-reqs",
    "--ssl-ciphers",
    "--allowed-origins",
    "--allowed-methods",
    "--allowed-headers",
    "--disable-access-log-for-endpoints",
    "--api-server-count",
    "--uds",
    "--config",
    "--kv-cache-dtype-skip-layers",
    "--tokenizer-mode",
    "--max-seq-len-to-capture",
    "--limit-mm-per-prompt",
    "--response-role",
    "--chat-template-content-format",
    "--long-prefill-token-threshold",
    "--max-num-partial-prefills",
    "--override-generation-config",
    "--logits-processors",
    "--worker-cls",
    "--task",
    "--runner",
    "--structured-outputs-config",
    "--default-chat-template-kwargs",
    "--max-parallel-loading-workers",
    "--stream-interval",
]
IGNORED_MULTI_FLAGS = ["--lora-modules", "--kv-cache-dtype-skip-layers"]
# vLLM boolean flags (BooleanOptionalAction, so --no-X too) that change nothing in the simulation.
IGNORED_BOOL_FLAGS = [
    "--enforce-eager",
    "--enable-lora",
    "--trust-remote-code",
    "--enable-log-requests",
    "--enable-chunked-prefill",
    "--async-scheduling",
    "--enable-expert-parallel",
    "--disable-custom-all-reduce",
    "--enable-prompt-tokens-details",
    "--enable-server-load-tracking",
    "--enable-tokenizer-info-endpoint",
    "--enable-log-outputs",
    "--enable-per-request-metrics",
    "--enable-auto-tool-choice",
    "--disable-uvicorn-access-log",
    "--disable-fastapi-docs",
    "--enable-request-id-headers",
    "--allow-credentials",
    "--disable-log-stats",
    "--disable-frontend-multiprocessing",
    "--enable-ssl-refresh",
    "--allow-deprecated-quantization",
    "--return-tokens-as-token-ids",
    "--enable-prompt-embeds",
    "--kv-cache-metrics",
    "--disable-sliding-window",
    "--disable-cascade-attn",
]
_SHORT_ALIASES = {
    "-tp": "--tensor-parallel-size",
    "-q": "--quantization",
    "-pp": "--pipeline-parallel-size",
    "-dp": "--data-parallel-size",
    "-asc": "--api-server-count",
    "-n": "--nnodes",
    "-r": "--node-rank",
}


def human_readable_int(value: str) -> int:
    """vLLM's human_readable_int: 1k=1000, 1K=1024, 25.6k, 2M ..."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT]?)", value.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"Invalid number: {value!r}")
    number, suffix = m.groups()
    decimal = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
    binary = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    mult = decimal.get(suffix) or binary.get(suffix) or 1
    if suffix in binary and "." in number:
        raise argparse.ArgumentTypeError(f"Decimals are not allowed with binary suffixes: {value!r}")
    return int(float(number) * mult)


def max_model_len_type(value: str) -> int:
    """human_readable_int_or_auto: -1 or auto mean "fit into GPU memory" (returned as -1)."""
    if value.strip().lower() in ("-1", "auto"):
        return -1
    return human_readable_int(value)


def unit_fraction(value: str) -> float:
    f = float(value)
    if not 0.0 < f <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return f


def probability(value: str) -> float:
    f = float(value)
    if not 0.0 <= f <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {value}")
    return f


def positive_float(value: str) -> float:
    f = float(value)
    if f <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return f


def build_parser() -> argparse.ArgumentParser:
    """The `serve` parser: vLLM's flags plus the simulator's --sim-* knobs."""
    parser = argparse.ArgumentParser(prog="python -m vllm_sim", description="vLLM-compatible simulator")
    sub = parser.add_subparsers(dest="subcommand", required=True)
    p = sub.add_parser("serve", usage="python -m vllm_sim serve [model_tag] [options]")
    p.add_argument("model_tag", nargs="?", default=None, help="Model name or path, as for `vllm serve`.")
    p.add_argument("--model", default=None, help=argparse.SUPPRESS)
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", nargs="+", default=None)
    # vLLM's `--middleware` (append): import paths of ASGI middleware classes; the simulator runs each
    # as a filter in front of its routes (server.asgi_filter), e.g. nodes/engines/guard.py.
    p.add_argument("--middleware", action="append", default=[])
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--max-model-len", type=max_model_len_type, default=None)
    p.add_argument("--gpu-memory-utilization", type=unit_fraction, default=0.92)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=human_readable_int, default=None)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    # Pipeline stages: layers (and their KV cache) split over PP x TP GPUs, micro-batches passed along.
    p.add_argument("--pipeline-parallel-size", type=int, default=1)
    # Data parallel: N engine cores, each with its own TP GPUs, KV cache and `engine="i"` metric series.
    p.add_argument("--data-parallel-size", type=int, default=1)
    # One engine over several hosts without Ray (vllm_sim/multinode.py): vLLM's ParallelConfig fields
    # (vllm/config/parallel.py:270-281) under arg_utils.py:1025-1028's names, and serve's --headless
    # (entrypoints/openai/cli_args.py:379-385) for the nodes that run workers only.
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=29501)
    p.add_argument("--headless", action="store_true", default=False)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quantization", default=None)
    p.add_argument("--dtype", choices=DTYPES, default="auto")
    p.add_argument("--kv-cache-dtype", choices=sorted(KV_CACHE_DTYPES), default="auto")
    p.add_argument("--max-logprobs", type=int, default=20)
    p.add_argument("--num-gpu-blocks-override", type=int, default=None)
    p.add_argument("--enable-force-include-usage", action=argparse.BooleanOptionalAction, default=False)
    for flag in IGNORED_VALUE_FLAGS:
        if flag not in IGNORED_MULTI_FLAGS:
            p.add_argument(flag, default=None, help=argparse.SUPPRESS)
    for flag in IGNORED_MULTI_FLAGS:
        p.add_argument(flag, nargs="+", default=None, help=argparse.SUPPRESS)
    for flag in IGNORED_BOOL_FLAGS:
        p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=argparse.SUPPRESS)
    # Modelled: without it /sleep still pauses the engine but frees no GPU memory (vLLM allocates the
    # weights and KV cache in its sleep-capable memory pool only in sleep mode).
    p.add_argument("--enable-sleep-mode", action=argparse.BooleanOptionalAction, default=False)
    sim = p.add_argument_group("simulator", "Knobs of the simulation (no vLLM equivalent).")
    sim.add_argument("--sim-profile", choices=sorted(PROFILES), default=DEFAULT_PROFILE)
    sim.add_argument(
        "--sim-time-scale",
        type=positive_float,
        default=1.0,
        help="Run this many times faster than the modelled hardware (metrics stay in model time).",
    )
    sim.add_argument(
        "--sim-quality-drift",
        type=probability,
        default=0.0,
        help="Make a quantized twin: at this fraction of contexts its top-1 token swaps with rank 2, "
        "and its other probabilities move a little (docs/simulator.md).",
    )
    sim.add_argument(
        "--sim-mean-output-tokens",
        type=int,
        default=128,
        help="Mean length at which the simulated model emits end-of-sequence.",
    )
    sim.add_argument(
        "--sim-crash-after",
        type=int,
        default=None,
        help="Exit (code 1, connections dropped) when request N+1 arrives.",
    )
    sim.add_argument(
        "--sim-hang-after",
        type=int,
        default=None,
        help="After N requests the engine stops stepping; /health still answers 200.",
    )
    sim.add_argument(
        "--sim-engine-dead-after",
        type=int,
        default=None,
        help="When request N+1 arrives the engine core dies: /health answers 503, requests 500.",
    )
    sim.add_argument(
        "--sim-startup-delay",
        type=float,
        default=0.0,
        help="Seconds of 'model loading' while the socket accepts but nothing answers.",
    )
    sim.add_argument(
        "--sim-error-rate",
        type=probability,
        default=0.0,
        help="Fraction of generation requests answered with a 500 InternalServerError.",
    )
    sim.add_argument(
        "--sim-ray-placement-timeout",
        type=positive_float,
        default=1800.0,
        help="With --distributed-executor-backend ray: seconds to wait for the placement group "
        "(vLLM's PG_WAIT_TIMEOUT, 1800).",
    )
    sim.add_argument(
        "--sim-peer-timeout",
        type=positive_float,
        default=600.0,
        help="With --nnodes > 1: seconds the head waits for the other nodes, and a headless node for "
        "the head (torch.distributed's default process-group timeout, 600).",
    )
    sim.add_argument(
        "--sim-vocab-size",
        type=int,
        default=None,
        help="Vocabulary size of the served model, which bounds token ids in logit_bias, "
        "allowed_token_ids and logprob counts (default: `vocab_size` of the model directory's "
        "config.json, as vLLM reads it, else the profile's model).",
    )
    sim.add_argument("--sim-gpu-index", type=int, default=0, help="Index of the first modelled GPU.")
    sim.add_argument(
        "--sim-gpu-uuid-seed", default=None, help="Seed of the modelled GPUs' UUIDs (default: port)."
    )
    return parser


def normalize_argv(argv: list[str]) -> list[str]:
    """vLLM's FlexibleArgumentParser habits: `_` == `-` in flag names, -tp/-q short aliases."""
    out: list[str] = []
    for a in argv:
        if a.startswith("--"):
            name, eq, val = a.partition("=")
            a = name.replace("_", "-") + eq + val
        elif a in _SHORT_ALIASES:
            a = _SHORT_ALIASES[a]
        out.append(a)
    return out


def parse_args(argv: list[str], env: Mapping[str, str] | None = None) -> argparse.Namespace:
    """Parse and resolve the model: the positional wins over --model, VLLM_API_KEY is the key fallback."""
    parser = build_parser()
    args = parser.parse_args(normalize_argv(argv))
    model = args.model_tag or args.model
    if model is None:
        if args.served_model_name:
            parser.error(
                "`model` should be provided as the first positional argument when using `vllm serve`. "
                "i.e. `vllm serve <model> --<arg> <value>`."
            )
        model = "Qwen/Qwen3-0.6B"  # vLLM's default ModelConfig.model
    args.model = model
    environ = os.environ if env is None else env
    if args.api_key is None and environ.get("VLLM_API_KEY"):
        args.api_key = [environ["VLLM_API_KEY"]]
    if args.sim_profile not in PROFILES:
        parser.error(f"unknown profile {args.sim_profile}")
    return args
