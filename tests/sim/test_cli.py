"""The command line behaves like `vllm serve`: same flags, argparse errors for unknown ones, start-up
errors (exit 1) when the model does not fit the modelled GPU."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from nodes.engines.vllm import KV_CACHE_DTYPES as adapter_dtypes
from tests.sim.conftest import MODEL, SimFactory
from tests.sim.http import call_json
from vllm_sim.cli import KV_CACHE_DTYPES as sim_dtypes
from vllm_sim.testing import REPO_ROOT, SimStartError, start_sim


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vllm_sim", "serve", MODEL, "--host", "127.0.0.1", "--port", "1", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize("flag", ["--bogus-flag", "--swap-space", "--disable-log-requests"])
def test_unknown_or_removed_flags_are_argparse_errors(flag: str) -> None:
    result = run_cli(flag, "4")
    assert result.returncode == 2
    assert "unrecognized arguments" in result.stderr


def test_bad_choice_is_an_argparse_error() -> None:
    result = run_cli("--kv-cache-dtype", "fp7")
    assert result.returncode == 2 and "invalid choice" in result.stderr


def test_vllm_flags_it_does_not_model_are_accepted(sim_factory: SimFactory) -> None:
    sim = sim_factory(
        "--max_model_len", "2k",  # underscores and human-readable ints, like vLLM's parser
        "--enforce-eager", "--trust-remote-code", "--no-enable-log-requests", "--dtype", "bfloat16",
        "--load-format", "auto", "--generation-config", "vllm", "--enable-chunked-prefill",
        "--quantization", "fbgemm_fp8", "--allow-deprecated-quantization", "--kv-cache-dtype", "fp8",
        "--disable-log-stats", "-tp", "1",
    )  # fmt: skip
    _, models = call_json(sim.base_url + "/v1/models")
    assert models["data"][0]["max_model_len"] == 2000


def test_seventy_b_on_one_a100_runs_out_of_memory() -> None:
    with pytest.raises(SimStartError) as exc:
        start_sim(MODEL, "--max-model-len", "8192", profile="a100-llama3-70b-fp16")
    assert "exited with 1" in str(exc.value) and "CUDA out of memory" in str(exc.value)


def test_seventy_b_with_tensor_parallel_four_models_four_gpus(sim_factory: SimFactory) -> None:
    sim = sim_factory(
        "--max-model-len", "8192", "--tensor-parallel-size", "4", "--sim-profile", "a100-llama3-70b-fp16"
    )
    _, gpu = call_json(sim.base_url + "/sim/gpu")
    assert [g["index"] for g in gpu["gpus"]] == [0, 1, 2, 3]
    assert len({g["uuid"] for g in gpu["gpus"]}) == 4


def test_context_larger_than_kv_cache_refuses_to_start_like_vllm() -> None:
    # A10 + 8B int4 holds ~114k tokens of KV: the model's full 131072 context does not fit.
    with pytest.raises(SimStartError) as exc:
        start_sim(MODEL, profile="a10-llama3-8b-int4")
    assert "estimated maximum model length is" in str(exc.value)


def test_max_model_len_auto_fits_the_kv_cache(sim_factory: SimFactory) -> None:
    sim = sim_factory("--max-model-len", "auto", "--sim-profile", "a10-llama3-8b-int4")
    _, models = call_json(sim.base_url + "/v1/models")
    assert 100_000 < models["data"][0]["max_model_len"] < 131072


def test_gpu_memory_utilization_changes_the_block_count(sim_factory: SimFactory) -> None:
    low = sim_factory("--max-model-len", "4096", "--gpu-memory-utilization", "0.5")
    high = sim_factory("--max-model-len", "4096", "--gpu-memory-utilization", "0.9")
    _, a = call_json(low.base_url + "/sim/stats")
    _, b = call_json(high.base_url + "/sim/stats")
    assert a["num_gpu_blocks"] < b["num_gpu_blocks"]


def test_the_simulator_and_the_vllm_adapter_accept_vllms_kv_cache_dtypes() -> None:
    # The simulator keeps its own copy of vLLM's list (it imports nothing of the product); both copies
    # must stay vLLM's, as read from its source into tests/data/vllm/serve-flags.md.
    flags = (REPO_ROOT / "tests/data/vllm/serve-flags.md").read_text()
    section = flags.split("### Accepted `--kv-cache-dtype` values", 1)[1]
    listed = re.search(r"^`([a-z0-9_, ]+)`$", section, re.M)
    assert listed is not None
    vllm_dtypes = {name.strip() for name in listed.group(1).split(",")}
    assert set(sim_dtypes) == vllm_dtypes
    assert set(adapter_dtypes) == vllm_dtypes
