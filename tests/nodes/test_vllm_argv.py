"""The vLLM adapter's command line, checked against vLLM's documented `serve` flags."""

from __future__ import annotations

import re
from pathlib import Path

from nodes.engines import sim, vllm
from nodes.engines.base import EngineSpec

# vLLM's `serve` flags as read from its source; kept in the repo, origin in tests/data/vllm/README.md.
REFERENCE = Path(__file__).parents[1] / "data" / "vllm" / "serve-flags.md"


def documented_flags() -> set[str]:
    """Every `--flag` spelled in backticks in the reference, minus the ones it says were removed."""
    text = REFERENCE.read_text()
    flags = set(re.findall(r"`(--[a-z0-9][a-z0-9-]*)`", text))
    for removed in re.findall(r"\| `(--[a-z0-9-]+)` \| \*\*does not exist", text):
        flags.discard(removed)
    return flags


def removed_flags() -> set[str]:
    return set(re.findall(r"\| `(--[a-z0-9-]+)` \| \*\*does not exist", REFERENCE.read_text()))


def spec(**overrides: object) -> EngineSpec:
    values: dict[str, object] = {
        "model_path": "/models/llama-3.1-8b",
        "served_model_name": "llama-3.1-8b",
        "port": 8101,
        "api_key": "k-secret",
        "quantization_method": "awq",
        "kv_cache_dtype": "fp8",
        "gpu_indices": (2, 3),
        "gpu_memory_utilization": 0.45,
        "max_model_len": 32768,
        "block_size": 32,
        "max_num_seqs": 64,
        "max_num_batched_tokens": 8192,
        "tensor_parallel_size": 2,
        "enable_prefix_caching": False,
        "python": "/venv/bin/python",
    }
    values.update(overrides)
    return EngineSpec(**values)  # type: ignore[arg-type]


def option_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_every_flag_is_documented_and_none_is_removed() -> None:
    argv = vllm.build_argv(spec())
    used = {a for a in argv if a.startswith("--")}
    assert used, argv
    assert used <= documented_flags(), used - documented_flags()
    assert not used & removed_flags()
    assert removed_flags() >= {"--swap-space", "--disable-log-requests"}


def test_model_is_the_positional_of_serve_and_values_are_passed_through() -> None:
    s = spec()
    argv = vllm.build_argv(s)
    serve = argv.index("serve")
    assert argv[serve + 1] == s.model_path
    assert "--model" not in argv
    assert option_value(argv, "--served-model-name") == s.served_model_name
    # The key travels in the environment (VLLM_API_KEY), where `ps` cannot read it.
    assert "--api-key" not in argv and s.api_key not in argv
    assert vllm.build_env(s)["VLLM_API_KEY"] == s.api_key
    assert option_value(argv, "--middleware") == "nodes.engines.guard.EngineKeyGuard"
    assert option_value(argv, "--port") == str(s.port)
    assert float(option_value(argv, "--gpu-memory-utilization")) == s.gpu_memory_utilization
    assert int(option_value(argv, "--max-model-len")) == s.max_model_len
    assert int(option_value(argv, "--block-size")) == s.block_size
    assert int(option_value(argv, "--max-num-seqs")) == s.max_num_seqs
    assert int(option_value(argv, "--max-num-batched-tokens")) == s.max_num_batched_tokens
    assert int(option_value(argv, "--tensor-parallel-size")) == s.tensor_parallel_size
    assert option_value(argv, "--quantization") == "awq"
    assert option_value(argv, "--kv-cache-dtype") == "fp8"
    assert "--no-enable-prefix-caching" in argv and "--enable-prefix-caching" not in argv
    assert vllm.build_env(s)["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_optional_flags_are_left_out_when_unset() -> None:
    argv = vllm.build_argv(
        spec(
            quantization_method=None,
            kv_cache_dtype=None,
            max_num_batched_tokens=None,
            enable_prefix_caching=True,
        )
    )
    for flag in (
        "--quantization",
        "--kv-cache-dtype",
        "--max-num-batched-tokens",
        "--no-enable-prefix-caching",
    ):
        assert flag not in argv
    assert "--enable-prefix-caching" in argv


def test_deprecated_quantization_gets_its_opt_in_flag() -> None:
    argv = vllm.build_argv(spec(quantization_method="fbgemm_fp8"))
    assert "--allow-deprecated-quantization" in argv


def test_known_quantization_methods_match_the_reference() -> None:
    text = REFERENCE.read_text()
    section = text.split("### Accepted `--quantization` values", 1)[1]
    line = next(ln for ln in section.splitlines() if ln.startswith("`awq"))
    documented = {m.strip().strip("`") for m in line.split(",")}
    assert documented == set(vllm.QUANTIZATION_METHODS)


def test_simulator_takes_the_same_flags_and_its_parser_accepts_them() -> None:
    from vllm_sim.cli import parse_args

    s = spec(extra_args=("--sim-time-scale", "10"))
    argv = sim.build_argv(s)
    serve = argv.index("serve")
    args = parse_args(argv[serve:], env=sim.build_env(s))
    assert args.model == s.model_path
    assert args.served_model_name == [s.served_model_name]
    assert args.api_key == [s.api_key]
    assert args.middleware == ["nodes.engines.guard.EngineKeyGuard"]
    assert args.max_model_len == s.max_model_len
    assert args.enable_prefix_caching is False
    assert args.sim_time_scale == 10
    assert args.sim_gpu_index == 2
