"""Issue 20, "Launch arguments": the console launches vLLM the way vLLM expects to be launched.

Each test names what vLLM does (file:line at vLLM 2f41c894, from tests/data/vllm/serve-flags.md
unless said otherwise) and checks the console's behaviour against it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from models_registry.estimate import (
    VLLM_DEFAULT_BLOCK_SIZE,
    VLLM_DEFAULT_GPU_MEMORY_UTILIZATION,
    vllm_batch_defaults,
)
from nodes.engines import vllm
from nodes.engines.base import EngineSpec
from tests.nodes.conftest import free_port

REFERENCE = Path(__file__).parents[1] / "data" / "vllm" / "serve-flags.md"
GIB = 1 << 30


def bare_spec(**overrides: Any) -> EngineSpec:
    values: dict[str, Any] = {
        "model_path": "/models/m",
        "served_model_name": "m",
        "port": 8101,
        "api_key": "k-secret",
        "python": "/venv/bin/python",
    }
    values.update(overrides)
    return EngineSpec(**values)


# --- 2, 3: flags the admin did not set are omitted --------------------------------------------


def test_unset_engine_parameters_are_left_to_vllm() -> None:
    """vLLM: `--block-size` given marks it user-set and overrides the attention backend's preferred
    size (vllm/platforms/interface.py:628-641); gpu_memory_utilization defaults to 0.92
    (vllm/config/cache.py:80); max_num_seqs / max_num_batched_tokens come from get_batch_defaults()
    (vllm/engine/arg_utils.py:2566-2657). The console passes none of them unless set."""
    argv = vllm.build_argv(bare_spec())
    for flag in (
        "--block-size",
        "--gpu-memory-utilization",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--quantization",
        "--pipeline-parallel-size",
    ):
        assert flag not in argv, flag
    argv = vllm.build_argv(bare_spec(block_size=32, gpu_memory_utilization=0.5, max_num_seqs=8))
    assert argv[argv.index("--block-size") + 1] == "32"
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.5"
    assert argv[argv.index("--max-num-seqs") + 1] == "8"


def test_the_console_defaults_named_in_the_reference_are_vllms() -> None:
    """The two constants the estimate uses are the reference's (cache.py:80, cache.py:59)."""
    text = REFERENCE.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `--gpu-memory-utilization`"))
    assert f"**`{VLLM_DEFAULT_GPU_MEMORY_UTILIZATION}`**" in row
    row = next(line for line in text.splitlines() if line.startswith("| `--block-size`"))
    assert f"DEFAULT_BLOCK_SIZE = {VLLM_DEFAULT_BLOCK_SIZE}" in row


@pytest.mark.parametrize(
    ("memory_gib", "name", "seqs", "tokens"),
    [
        (79.6, "NVIDIA H100 80GB HBM3", 1024, 8192),  # >=70 GiB, not A100
        (139.8, "NVIDIA H200", 1024, 8192),
        (79.3, "NVIDIA A100-SXM4-80GB", 256, 2048),  # A100 excluded (PR #17885)
        (22.0, "NVIDIA A10", 256, 2048),
        (178.0, "NVIDIA B200", 1024, 16384),  # >=160 GiB
    ],
)
def test_batch_defaults_follow_get_batch_defaults(
    memory_gib: float, name: str, seqs: int, tokens: int
) -> None:
    """get_batch_defaults() (arg_utils.py:2566-2657), API-server context: 256/2048 on normal GPUs,
    1024/8192 at >=70 GiB and not A100, 1024/16384 at >=160 GiB."""
    got = vllm_batch_defaults(int(memory_gib * GIB), name, max_model_len=8192)
    assert (got.max_num_seqs, got.max_num_batched_tokens) == (seqs, tokens)


def test_batch_default_caps_apply_only_to_omitted_values() -> None:
    """_set_default_max_num_seqs_and_batched_tokens_args (arg_utils.py:2769-2860): an omitted
    max_num_batched_tokens is capped at max_num_seqs * max_model_len, and an omitted max_num_seqs at
    max_num_batched_tokens; given values are kept."""
    h100 = 80 * GIB
    capped = vllm_batch_defaults(h100, "H100", max_model_len=4, max_num_seqs=16)
    assert capped.max_num_batched_tokens == 64 and capped.max_num_seqs == 16
    seqs_capped = vllm_batch_defaults(h100, "H100", max_model_len=4096, max_num_batched_tokens=512)
    assert seqs_capped.max_num_seqs == 512 and seqs_capped.max_num_batched_tokens == 512
    given = vllm_batch_defaults(h100, "H100", max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=9)
    assert (given.max_num_seqs, given.max_num_batched_tokens) == (8, 9)


# --- 4: no --disable-log-stats; extra_args checked against the reference ---------------------


def test_disable_log_stats_is_not_forced() -> None:
    """vLLM raises ValueError for --disable-log-stats with --enable-per-request-metrics
    (cli_args.py:429-435), so the console no longer adds it."""
    argv = vllm.build_argv(bare_spec(extra_args=("--enable-per-request-metrics",)))
    assert "--disable-log-stats" not in argv
    assert "--enable-per-request-metrics" in argv


def reference_flags() -> set[str]:
    text = REFERENCE.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `--")]
    flags: set[str] = set()
    for row in rows:
        cell = row.split("|")[1]
        if "does not exist" in row:
            continue
        flags |= set(re.findall(r"`(--[a-z0-9][a-z0-9-]*)`", cell))
    return flags


def test_the_flag_table_is_the_references() -> None:
    """Every flag the reference's tables list is known (plus `--allow-deprecated-quantization`,
    model.py:1334-1347, and `--model`, arg_utils.py:844-845); removed ones are not."""
    table_flags = set(vllm.SERVE_FLAGS)
    negated = {f for f in reference_flags() if f.startswith("--no-")}
    assert reference_flags() - negated <= table_flags, reference_flags() - negated - table_flags
    for flag in negated:  # BooleanOptionalAction pairs: the positive flag is a bool here
        assert vllm.SERVE_FLAGS["--" + flag[len("--no-") :]] is False, flag
        assert not any("has no flag" in p for p in vllm.check_extra_args([flag])), flag
    extra = table_flags - reference_flags()
    text = REFERENCE.read_text()
    assert all(f"`{flag}`" in text for flag in extra), extra
    assert set(vllm.REMOVED_FLAGS) == {"--swap-space", "--disable-log-requests"}
    assert not set(vllm.REMOVED_FLAGS) & table_flags


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--no-such-flag", "1"], "vLLM has no flag --no-such-flag"),
        (["--swap-space", "4"], "PR #36216"),
        (["--disable-log-requests"], "PR #35723"),
        (["--disable-log-stats", "--enable-per-request-metrics"], "cli_args.py:429-435"),
        (["--enable-log-outputs"], "requires --enable-log-requests"),
        (["--enable-auto-tool-choice"], "requires --tool-call-parser"),
        (["--block-size", "32"], "set it in the block_size field"),
        (["--gpu_memory_utilization=0.5"], "set it in the gpu_memory_utilization field"),
        (["-q", "awq"], "quantization_override"),
        (["-pp", "2"], "pipeline_parallel_size"),
        (["--no-disable-log-stats"], "vLLM has no flag --no-disable-log-stats"),
        (["--enforce-eager", "--enforce-eager"], "given twice"),
        (["stray"], "is not a flag"),
    ],
)
def test_bad_extra_args_are_refused_with_the_reason(args: list[str], reason: str) -> None:
    problems = vllm.check_extra_args(args)
    assert any(reason in p for p in problems), problems


def test_good_extra_args_pass() -> None:
    """BooleanOptionalAction gives `--no-` forms (arg_utils.py:352-354); `_` spells `-`
    (argparse_utils.py:301-320); `--json-arg.key` and -O<n> are the parser's own syntax."""
    ok = [
        "--enforce-eager",
        "--no-enable-chunked-prefill",
        "--max-logprobs",
        "-1",
        "--trust_remote_code",
        "--allowed-origins",
        "a",
        "b",
        "--compilation-config.mode",
        "3",
        "-O3",
        "--enable-log-requests",
        "--enable-log-outputs",
        "--enable-per-request-metrics",
    ]
    assert vllm.check_extra_args(ok) == []
    assert vllm.check_extra_args(["--sim-time-scale", "5"], allow_prefix="--sim-") == []


# --- 1: the kernel the engine reports ---------------------------------------------------------


def test_the_marlin_kernel_line_is_read_from_the_engine_log() -> None:
    """Before PR #42727 / #38288, AWQMarlinConfig/GPTQMarlinConfig.override_quantization_method logged
    these two messages (awq_marlin.py:263-276 before 8d4f54966c, per tests/data/vllm/source-2f41c894.json)."""
    upgraded = "INFO awq_marlin.py:1] The model is convertible to awq_marlin during runtime. " + (
        "Using awq_marlin kernel."
    )
    forced = (
        "INFO awq_marlin.py:2] Detected that the model can run with awq_marlin, however you specified "
        "quantization=awq explicitly, so forcing awq. Use quantization=awq_marlin for faster inference"
    )
    assert vllm.reported_quantization_kernel("x\n" + upgraded + "\ny") == "awq_marlin"
    assert vllm.reported_quantization_kernel(forced) == "awq (awq_marlin available)"
    assert vllm.reported_quantization_kernel("nothing about kernels") is None


def test_the_kernel_vllm_2f41c894_logs_is_read_and_awq_is_no_longer_forced() -> None:
    """At 2f41c894 `--quantization awq` (or gptq) still takes the AutoAWQ/AutoGPTQ path, which picks the
    Marlin kernel when it can (auto_awq.py:259-283, auto_gptq.py:218-238); the kernel is logged by the
    linear method (auto_awq.py:448, auto_gptq.py:357)."""
    ref = json.loads((REFERENCE.parent / "source-2f41c894.json").read_text())["quantization_override"]
    assert "awq" in ref["awq_user_quant_upgraded"] and "gptq" in ref["gptq_user_quant_upgraded"]
    assert ref["config_class_of"]["awq"] == ref["config_class_of"]["awq_marlin"] == "AutoAWQConfig"
    lines = ref["kernel_log_lines"]
    awq = "INFO 08-20 12:00:00 [auto_awq.py:448] " + lines["auto_awq.py:448"].format(
        kernel="MarlinLinearKernel"
    )
    gptq = "INFO [auto_gptq.py:357] " + lines["auto_gptq.py:357"].format(kernel="MacheteLinearKernel")
    fallback = "WARNING [auto_awq.py:322] " + lines["auto_awq.py:322-326"].format(prefix="lm_head")
    assert vllm.reported_quantization_kernel(awq) == "auto_awq (MarlinLinearKernel)"
    assert vllm.reported_quantization_kernel(gptq) == "auto_gptq (MacheteLinearKernel)"
    got = vllm.reported_quantization_kernel(awq + "\n" + fallback)
    assert got == "auto_awq (MarlinLinearKernel) + AWQ fallback"
    # The longest kernel name still fits the stored field (nodes/models.py: max_length 64).
    longest = lines["auto_awq.py:448"].format(kernel="RDNAHybridW4A16LinearKernel")
    assert len(vllm.reported_quantization_kernel(longest + "\n" + fallback) or "") <= 64


# --- with the database: preflight, API, agent ---------------------------------------------------


def payload(version: Any, host: Any, **overrides: Any) -> dict[str, Any]:
    data = {
        "name": "dep",
        "model_version": version.pk,
        "engine": "vllm",
        "host": host.pk,
        "gpu_indices": [0],
        "max_model_len": 8192,
        "port": free_port(),
        "served_model_name": "llama-3.1-8b",
    }
    data.update(overrides)
    return data


@pytest.mark.django_db
def test_a_deployment_saved_without_engine_values_keeps_them_null_and_the_fit_names_vllms(
    admin_client: Any, llama_version: Any, host: Any
) -> None:
    """Null means "vLLM's default"; the fit check uses the value vLLM will use on this GPU
    (the simulated H100 80GB: 0.92, 1024 sequences, 8192 batched tokens)."""
    response = admin_client.post("/api/deployments/", payload(llama_version, host), format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["gpu_memory_utilization"] is None and body["max_num_seqs"] is None
    assert body["block_size"] is None and body["pipeline_parallel_size"] == 1
    fit = body["fit"]
    assert fit["gpu_memory_utilization"] == 0.92
    assert fit["max_num_seqs"] == 1024 and fit["max_num_batched_tokens"] == 8192
    assert any("vLLM's default" in note for note in fit["vllm_defaults"])


@pytest.mark.django_db
def test_extra_args_refusal_is_a_json_field_error_and_nothing_is_saved(
    admin_client: Any, llama_version: Any, host: Any
) -> None:
    data = payload(llama_version, host, extra_args=["--disable-log-stats", "--enable-per-request-metrics"])
    response = admin_client.post("/api/deployments/", data, format="json")
    assert response.status_code == 400
    assert "cli_args.py:429-435" in " ".join(response.json()["extra_args"])
    response = admin_client.post(
        "/api/deployments/", payload(llama_version, host, quantization_override="nope"), format="json"
    )
    assert response.status_code == 400 and "quantization_override" in response.json()


@pytest.mark.django_db
def test_pipeline_parallel_needs_tensor_times_pipeline_gpus(
    admin_client: Any, llama_version: Any, node_settings: Any
) -> None:
    """vLLM's world size is tensor x pipeline (arg_utils.py:2769ff `world_size = pp * tp`)."""
    from tests.nodes.conftest import make_host

    host = make_host("node-4", gpus=4)
    three = payload(
        llama_version, host, gpu_indices=[0, 1, 2], pipeline_parallel_size=2, tensor_parallel_size=2
    )
    refused = admin_client.post("/api/deployments/", three, format="json")
    assert refused.status_code == 400
    assert "2 x 2 = 4" in " ".join(refused.json()["tensor_parallel_size"])
    ok = admin_client.post(
        "/api/deployments/",
        payload(llama_version, host, gpu_indices=[0, 1, 2, 3], pipeline_parallel_size=2),
        format="json",
    )
    assert ok.status_code == 201, ok.content
    assert ok.json()["tensor_parallel_size"] == 2  # the GPUs over the pipeline stages

    from nodes.agent.services import engine_spec
    from nodes.models import Deployment

    argv = vllm.build_argv(engine_spec(Deployment.objects.get(pk=ok.json()["id"])))
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"


@pytest.mark.django_db
def test_a_prequantized_checkpoint_gets_no_quantization_flag_unless_forced(
    make_deployment: Any, awq_config: Any, llama_version: Any
) -> None:
    """vLLM upgrades AWQ to awq_marlin only when `--quantization` is not forced
    (awq_marlin.py override_quantization_method: user_quant None/"marlin"/"awq_marlin")."""
    from nodes.agent.services import engine_spec

    llama_version.quantization = awq_config
    llama_version.save()
    own = make_deployment(engine="vllm", extra_args=[])
    assert engine_spec(own).quantization_method is None
    forced = make_deployment(engine="vllm", extra_args=[], quantization_override="awq")
    assert engine_spec(forced).quantization_method == "awq"


@pytest.mark.django_db
def test_online_quantization_of_an_unquantized_checkpoint_still_passes_the_flag(
    make_deployment: Any, llama_version: Any
) -> None:
    from models_registry.models import QuantizationConfig
    from nodes.agent.services import engine_spec

    fp8 = QuantizationConfig.objects.create(name="fp8-online", method="fp8", bits=8)
    dep = make_deployment(engine="vllm", extra_args=[], quantization=fp8)
    assert engine_spec(dep).quantization_method == "fp8"


@pytest.mark.django_db
def test_each_launch_keeps_its_record_in_the_event_history(make_deployment: Any, host: Any) -> None:
    """Item 6: vLLM version, driver/CUDA (NVML, or marked simulated), manifest digest, env names and
    the argv without the engine key, on the launch's own event; a second launch adds a second record."""
    from nodes.agent import runtime
    from nodes.lifecycle import engine_api_key

    host.agent_info = {"nvml": False, "simulated_gpus": True, "driver_version": None, "vllm_version": None}
    host.save()
    dep = make_deployment()
    assert runtime.launch(dep.pk) == "started"
    dep.refresh_from_db()
    key = engine_api_key(dep)
    assert runtime.restart(dep.pk) == "started"
    dep.refresh_from_db()
    records = [e.launch for e in dep.events.order_by("at", "id") if e.launch]
    assert len(records) == 2
    first = records[0]
    assert first["simulated"] and first["simulated_engine"] and first["simulated_gpus"]
    assert first["vllm_version"].endswith("+sim")
    assert first["manifest_digest"] == dep.model_version.manifest_digest != ""
    assert "CUDA_VISIBLE_DEVICES" in first["env"]
    assert key not in first["argv"] and key not in str(first)
    assert first["env"]["VLLM_API_KEY"] == "[redacted]"
    assert engine_api_key(dep) not in records[1]["argv"]
    runtime.Deployment.objects.filter(pk=dep.pk).update(desired_state="stopped")
    runtime.stop(dep.pk)


def test_the_simulator_reports_user_specified_block_size_truthfully() -> None:
    """vLLM's cache_config_info carries CacheConfig.user_specified_block_size, True only when
    `--block-size` was given (vllm/config/cache.py; interface.py:628-641)."""
    from prometheus_client import CollectorRegistry

    from vllm_sim.cli import parse_args
    from vllm_sim.metrics import EngineMetrics, cache_config_labels
    from vllm_sim.server import build_shape

    for extra, expected in (([], "False"), (["--block-size", "32"], "True")):
        args = parse_args(["serve", "/m", "--sim-profile", "h100-llama3-8b-fp16", *extra])
        shape = build_shape(args)
        EngineMetrics(
            shape, "m", True, CollectorRegistry(), user_specified_block_size=args.block_size is not None
        )
        assert (
            cache_config_labels(shape, True, args.block_size is not None)["user_specified_block_size"]
            == expected
        )
