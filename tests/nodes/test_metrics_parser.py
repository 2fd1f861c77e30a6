"""The /metrics parser against vLLM's own exposition text (tests/data/vllm/metrics.txt)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nodes.engines.metrics import bucket_delta, histogram_quantile, parse_vllm_metrics

# vLLM's exposition text, kept in the repo with its source (tests/data/vllm/README.md).
REFERENCE = Path(__file__).parents[1] / "data" / "vllm" / "metrics.txt"


def sample(text: str, name: str, extra: str = "") -> float:
    """The value of one unlabelled-by-le sample, read straight from the text with a regex."""
    match = re.search(rf"^{re.escape(name)}\{{{extra}[^}}]*\}} (\S+)$", text, re.MULTILINE)
    assert match, name
    return float(match.group(1))


def test_gauges_and_counters_match_the_text() -> None:
    text = REFERENCE.read_text()
    m = parse_vllm_metrics(text)
    assert m.num_requests_running == sample(text, "vllm:num_requests_running")
    assert m.num_requests_waiting == sample(text, "vllm:num_requests_waiting")
    assert m.kv_cache_usage_perc == sample(text, "vllm:kv_cache_usage_perc")
    assert 0 <= m.kv_cache_usage_perc <= 1
    assert m.prefix_cache_queries_total == sample(text, "vllm:prefix_cache_queries_total")
    assert m.prefix_cache_hits_total == sample(text, "vllm:prefix_cache_hits_total")
    assert m.prompt_tokens_total == sample(text, "vllm:prompt_tokens_total")
    assert m.generation_tokens_total == sample(text, "vllm:generation_tokens_total")


def test_cache_config_info_gives_the_kv_cache_size() -> None:
    text = REFERENCE.read_text()
    m = parse_vllm_metrics(text)
    info = re.search(r"^vllm:cache_config_info\{(.*)\} ", text, re.MULTILINE)
    assert info
    labels = dict(re.findall(r'(\w+)="([^"]*)"', info.group(1)))
    assert m.num_gpu_blocks == int(labels["num_gpu_blocks"])
    assert m.block_size == int(labels["block_size"])
    assert m.kv_cache_total_tokens == int(labels["kv_cache_size_tokens"])


def test_histograms_are_cumulative_and_complete() -> None:
    text = REFERENCE.read_text()
    m = parse_vllm_metrics(text)
    ttft_count = sample(text, "vllm:time_to_first_token_seconds_count")
    assert m.ttft_buckets[-1] == (float("inf"), ttft_count)
    counts = [c for _, c in m.ttft_buckets]
    assert counts == sorted(counts)
    itl_count = sample(text, "vllm:inter_token_latency_seconds_count")
    assert m.itl_buckets[-1][1] == itl_count
    p50 = histogram_quantile(0.5, m.ttft_buckets)
    assert p50 is not None
    # The median lies in the first bucket whose cumulative count reaches half the total.
    upper = next(le for le, c in m.ttft_buckets if c >= ttft_count / 2)
    lower = max([le for le, c in m.ttft_buckets if le < upper] or [0.0])
    assert lower <= p50 <= upper


def test_quantile_interpolates_inside_the_bucket() -> None:
    buckets = [(1.0, 0.0), (2.0, 10.0), (float("inf"), 10.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(1.5)
    assert histogram_quantile(0.5, [(1.0, 0.0), (float("inf"), 0.0)]) is None


def test_delta_between_scrapes_and_restart_reset() -> None:
    old = [(1.0, 5.0), (2.0, 8.0), (float("inf"), 8.0)]
    new = [(1.0, 6.0), (2.0, 12.0), (float("inf"), 12.0)]
    assert bucket_delta(new, old) == [(1.0, 1.0), (2.0, 4.0), (float("inf"), 4.0)]
    # A restarted engine's counters went down: the new scrape stands on its own.
    assert bucket_delta(old, new) == old


def test_data_parallel_engines_are_summed_and_usage_averaged() -> None:
    text = "\n".join(
        [
            "# TYPE vllm:num_requests_running gauge",
            'vllm:num_requests_running{engine="0",model_name="m"} 3.0',
            'vllm:num_requests_running{engine="1",model_name="m"} 4.0',
            "# TYPE vllm:kv_cache_usage_perc gauge",
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2',
            'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.4',
        ]
    )
    m = parse_vllm_metrics(text + "\n")
    assert m.num_requests_running == 7.0
    assert m.kv_cache_usage_perc == pytest.approx(0.3)


def test_the_reference_exposition_with_two_engines_adds_up() -> None:
    """vLLM labels every family with `engine`, one child per data-parallel engine core
    (vllm/v1/metrics/loggers.py:451-474, cache_config_info per engine at 1076-1098, as recorded in
    tests/data/vllm/source-2f41c894.json): the reference text with each engine="0" sample doubled as
    engine="1" must read as twice the work and twice the KV cache, with the same usage fraction."""
    one = REFERENCE.read_text()
    lines: list[str] = []
    for line in one.splitlines():
        lines.append(line)
        if not line.startswith("#") and 'engine="0"' in line:
            lines.append(line.replace('engine="0"', 'engine="1"'))
    two = "\n".join(lines) + "\n"
    single, double = parse_vllm_metrics(one), parse_vllm_metrics(two)
    for attr in ("prompt_tokens_total", "generation_tokens_total", "request_success_total",
                 "num_requests_running", "num_requests_waiting", "prefix_cache_queries_total"):  # fmt: skip
        assert getattr(double, attr) == pytest.approx(2 * getattr(single, attr)), attr
    assert double.kv_cache_usage_perc == pytest.approx(single.kv_cache_usage_perc)
    assert single.num_gpu_blocks and double.num_gpu_blocks == 2 * single.num_gpu_blocks
    assert double.ttft_buckets == [(le, 2 * n) for le, n in single.ttft_buckets]
