"""Reading an engine's Prometheus /metrics text into the few numbers the console and the proxy use.

Parsing is done by prometheus_client's own text parser (the library vLLM renders its metrics with);
this module only picks samples by name and sums them over vLLM's per-engine-core `engine` label.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

Buckets = list[tuple[float, float]]  # (upper bound `le`, cumulative count), sorted by bound


@dataclass
class EngineMetrics:
    """One scrape of an engine. Counters are cumulative since the engine started."""

    num_requests_running: float = 0.0
    num_requests_waiting: float = 0.0
    kv_cache_usage_perc: float = 0.0  # a 0..1 fraction despite the name
    prefix_cache_queries_total: float = 0.0
    prefix_cache_hits_total: float = 0.0
    prompt_tokens_total: float = 0.0
    generation_tokens_total: float = 0.0
    num_preemptions_total: float = 0.0
    request_success_total: float = 0.0
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    kv_cache_total_tokens: int | None = None
    ttft_buckets: Buckets = field(default_factory=list)
    itl_buckets: Buckets = field(default_factory=list)
    e2e_buckets: Buckets = field(default_factory=list)

    @property
    def tokens_processed(self) -> float:
        """Prompt plus generated tokens: moves whenever the engine does any work."""
        return self.prompt_tokens_total + self.generation_tokens_total


GAUGES = {
    "vllm:num_requests_running": "num_requests_running",
    "vllm:num_requests_waiting": "num_requests_waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total": "prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits_total",
    "vllm:prompt_tokens_total": "prompt_tokens_total",
    "vllm:generation_tokens_total": "generation_tokens_total",
    "vllm:num_preemptions_total": "num_preemptions_total",
    "vllm:request_success_total": "request_success_total",
}
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds_bucket": "ttft_buckets",
    "vllm:inter_token_latency_seconds_bucket": "itl_buckets",
    "vllm:e2e_request_latency_seconds_bucket": "e2e_buckets",
}
# Averaged, not summed, over data-parallel engine cores: a usage fraction does not add up.
AVERAGED = {"kv_cache_usage_perc"}


def _int_label(labels: dict[str, str], name: str) -> int | None:
    raw = labels.get(name)
    if raw is None or raw in ("None", ""):
        return None
    try:
        return int(float(raw))
    except ValueError:
        return None


def parse_vllm_metrics(text: str) -> EngineMetrics:
    """Parse vLLM's /metrics (also the simulator's, which mimics it). Unknown families are ignored."""
    out = EngineMetrics()
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    buckets: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    blocks_total = 0
    tokens_total = 0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            attr = GAUGES.get(sample.name)
            if attr is not None:
                sums[attr] += sample.value
                counts[attr] += 1
                continue
            hist = HISTOGRAMS.get(sample.name)
            if hist is not None:
                buckets[hist][float(sample.labels["le"])] += sample.value
                continue
            if sample.name == "vllm:cache_config_info":
                out.block_size = _int_label(sample.labels, "block_size")
                blocks = _int_label(sample.labels, "num_gpu_blocks")
                tokens = _int_label(sample.labels, "kv_cache_size_tokens")
                blocks_total += blocks or 0
                tokens_total += tokens or 0
    for attr, total in sums.items():
        setattr(out, attr, total / counts[attr] if attr in AVERAGED else total)
    for hist, by_le in buckets.items():
        setattr(out, hist, sorted(by_le.items()))
    if blocks_total:
        out.num_gpu_blocks = blocks_total
    if tokens_total:
        out.kv_cache_total_tokens = tokens_total
    elif out.num_gpu_blocks and out.block_size:
        out.kv_cache_total_tokens = out.num_gpu_blocks * out.block_size
    return out


def bucket_delta(newer: Buckets, older: Buckets) -> Buckets:
    """Buckets of the observations made between two scrapes (a restart resets to `newer`)."""
    old = dict(older)
    delta = [(le, count - old.get(le, 0.0)) for le, count in newer]
    if any(count < 0 for _, count in delta):
        return list(newer)
    return delta


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The q-quantile of a cumulative histogram, interpolated linearly inside the bucket.

    Same rule as Prometheus' histogram_quantile(); None when the histogram is empty.
    """
    if not buckets:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for upper_bound, count in buckets:
        if count >= rank:
            if math.isinf(upper_bound):
                # The open-ended bucket has no width to interpolate in: report its lower edge.
                return lower_bound
            in_bucket = count - lower_count
            if in_bucket <= 0:
                return upper_bound
            return lower_bound + (upper_bound - lower_bound) * (rank - lower_count) / in_bucket
        lower_bound, lower_count = upper_bound, count
    return lower_bound


def merge_buckets(parts: Iterable[Buckets]) -> Buckets:
    merged: dict[float, float] = defaultdict(float)
    for part in parts:
        for le, count in part:
            merged[le] += count
    return sorted(merged.items())
