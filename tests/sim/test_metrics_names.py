"""/metrics exposes vLLM's metric families with vLLM's names, types, HELP strings and label sets.

The reference (tests/data/vllm/metrics.txt) is the exposition assembled from vLLM's
vllm/v1/metrics/loggers.py at main 2f41c894 (see its header and tests/data/vllm/README.md).
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.sim.conftest import MODEL
from tests.sim.http import call
from vllm_sim.testing import SimHandle

REFERENCE = Path(__file__).parents[1] / "data" / "vllm" / "metrics.txt"


def families(exposition: str) -> dict[str, tuple[str, str, set[frozenset[str]]]]:
    out = {}
    for fam in text_string_to_metric_families(exposition):
        labelsets = {frozenset(k for k in s.labels if k != "le") for s in fam.samples}
        out[fam.name] = (fam.type, fam.documentation, labelsets)
    return out


def test_every_reference_family_is_exposed_with_the_same_type_help_and_labels(sim: SimHandle) -> None:
    call(sim.base_url + "/v1/completions", {"model": MODEL, "prompt": "warm up", "max_tokens": 2})
    status, _, body = call(sim.base_url + "/metrics")
    assert status == 200
    ours = families(body.decode())
    ref = families(REFERENCE.read_text())
    assert ref, "reference file parsed to nothing"
    for name, (kind, doc, labelsets) in ref.items():
        assert name in ours, f"missing metric family {name}"
        assert ours[name][0] == kind, name
        assert ours[name][1] == doc, name
        assert ours[name][2] == labelsets, name


def test_labels_carry_served_model_name_and_engine(sim: SimHandle) -> None:
    _, _, body = call(sim.base_url + "/metrics")
    text = body.decode()
    # model_name is the first --served-model-name.
    assert f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}}' in text
    assert 'finished_reason="repetition"' in text


def test_no_removed_metric_names(sim: SimHandle) -> None:
    _, _, body = call(sim.base_url + "/metrics")
    text = body.decode()
    for removed in (
        "vllm:gpu_cache_usage_perc",
        "vllm:gpu_prefix_cache_queries",
        "vllm:time_per_output_token_seconds",
        "vllm:num_requests_swapped",
        "vllm:avg_generation_throughput_toks_per_s",
    ):
        assert removed + "{" not in text and removed + " " not in text


def test_cache_config_info_reports_the_kv_cache(sim: SimHandle) -> None:
    _, _, body = call(sim.base_url + "/metrics")
    info = next(
        f for f in text_string_to_metric_families(body.decode()) if f.name == "vllm:cache_config_info"
    )
    labels = info.samples[0].labels
    assert labels["block_size"] == "16"
    assert labels["gpu_memory_utilization"] == "0.92"
    blocks = int(labels["num_gpu_blocks"])
    assert int(labels["kv_cache_size_tokens"]) == blocks * 16
    assert float(labels["kv_cache_max_concurrency"]) == blocks * 16 / 4096


def test_counters_follow_traffic(sim: SimHandle) -> None:
    def value(name: str) -> float:
        _, _, body = call(sim.base_url + "/metrics")
        for fam in text_string_to_metric_families(body.decode()):
            for s in fam.samples:
                if s.name == name and s.labels.get("finished_reason", "length") == "length":
                    return float(s.value)
        raise AssertionError(name)

    before_gen = value("vllm:generation_tokens_total")
    before_ok = value("vllm:request_success_total")
    before_ttft = value("vllm:time_to_first_token_seconds_count")
    call(
        sim.base_url + "/v1/completions",
        {"model": MODEL, "prompt": "x y z", "max_tokens": 7, "ignore_eos": True},
    )
    assert value("vllm:generation_tokens_total") - before_gen == 7
    assert value("vllm:request_success_total") - before_ok == 1
    assert value("vllm:time_to_first_token_seconds_count") - before_ttft == 1
