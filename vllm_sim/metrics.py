"""The vLLM Prometheus metrics, with vLLM's names, HELP strings, labels and buckets.

Source: vllm/v1/metrics/loggers.py (PrometheusStatLogger) at vLLM main 2f41c894, as recorded in
tests/data/vllm/metrics.md. Durations are observed in modelled time (wall time multiplied by
--sim-time-scale), so a sped-up simulator still reports the latencies of the hardware it models.
"""

from __future__ import annotations

import weakref
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from vllm_sim.profiles import EngineShape

LABELS = ["model_name", "engine"]
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")

TTFT_BUCKETS = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
]  # fmt: skip
ITL_BUCKETS = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
]  # fmt: skip
REQUEST_LATENCY_BUCKETS = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
]  # fmt: skip
ITERATION_TOKEN_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


# One family per metric name and registry; each data-parallel engine core binds its own children
# (`engine="0"`, `"1"`, ...), as vLLM's create_metric_per_engine does (vllm/v1/metrics/utils.py:11-19).
_FAMILIES: weakref.WeakKeyDictionary[CollectorRegistry, dict[str, Any]] = weakref.WeakKeyDictionary()


def _family(registry: CollectorRegistry, cls: type, name: str, doc: str, labels: list[str], **kw: Any) -> Any:
    known = _FAMILIES.setdefault(registry, {})
    if name not in known:
        known[name] = cls(name, doc, labels, registry=registry, **kw)
    return known[name]


def build_1_2_5_buckets(max_value: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's token-count histogram buckets)."""
    out: list[float] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exponent
            if v > max_value:
                return out
            out.append(float(v))
        exponent += 1


class EngineMetrics:
    """One engine's metric children (labels already bound), updated by the scheduler loop."""

    def __init__(
        self,
        shape: EngineShape,
        model_name: str,
        enable_prefix_caching: bool,
        registry: CollectorRegistry = REGISTRY,
        user_specified_block_size: bool = False,
        engine_index: int = 0,
    ) -> None:
        # `engine` is the data-parallel rank of the engine core (loggers.py:468-474).
        lv = {"model_name": model_name, "engine": str(engine_index)}
        r = registry

        def gauge(name: str, doc: str) -> Gauge:
            return _family(r, Gauge, name, doc, LABELS, multiprocess_mode="mostrecent")

        def counter(name: str, doc: str) -> Counter:
            return _family(r, Counter, name, doc, LABELS)

        def hist(name: str, doc: str, buckets: list[float]) -> Histogram:
            return _family(r, Histogram, name, doc, LABELS, buckets=buckets)

        self.num_running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        ).labels(**lv)
        self.num_waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        ).labels(**lv)
        by_reason = _family(
            r,
            Gauge,
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling "
            "capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked "
            "status). Sum of all reasons equals vllm:num_requests_waiting.",
            [*LABELS, "reason"],
            multiprocess_mode="mostrecent",
        )
        self.waiting_by_reason = {
            reason: by_reason.labels(reason=reason, **lv) for reason in ("capacity", "deferred")
        }
        for g in self.waiting_by_reason.values():
            g.set(0)
        self.kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        ).labels(**lv)
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        ).labels(**lv)
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        ).labels(**lv)
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        ).labels(**lv)
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.").labels(**lv)
        by_source = _family(
            r,
            Counter,
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            [*LABELS, "source"],
        )
        self.prompt_tokens_by_source = {
            src: by_source.labels(source=src, **lv)
            for src in ("local_compute", "local_cache_hit", "external_kv_transfer")
        }
        self.prompt_tokens_cached = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
        ).labels(**lv)
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        ).labels(**lv)
        success = _family(
            r,
            Counter,
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*LABELS, "finished_reason"],
        )
        self.request_success = {
            reason: success.labels(finished_reason=reason, **lv) for reason in FINISHED_REASONS
        }
        token_buckets = build_1_2_5_buckets(shape.max_model_len)
        self.request_prompt_tokens = hist(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets
        ).labels(**lv)
        self.request_generation_tokens = hist(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", token_buckets
        ).labels(**lv)
        self.request_params_max_tokens = hist(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", token_buckets
        ).labels(**lv)
        self.request_max_num_generation_tokens = hist(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            token_buckets,
        ).labels(**lv)
        self.request_params_n = hist(
            "vllm:request_params_n", "Histogram of the n request parameter.", [1.0, 2.0, 5.0, 10.0, 20.0]
        ).labels(**lv)
        self.iteration_tokens = hist(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            [float(b) for b in ITERATION_TOKEN_BUCKETS],
        ).labels(**lv)
        self.ttft = hist(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        ).labels(**lv)
        self.itl = hist(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS
        ).labels(**lv)
        self.tpot = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        ).labels(**lv)
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(**lv)
        self.queue_time = hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(**lv)
        self.inference_time = hist(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(**lv)
        self.prefill_time = hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(**lv)
        self.decode_time = hist(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(**lv)
        sleep = _family(
            r,
            Gauge,
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            [*LABELS, "sleep_state"],
            multiprocess_mode="mostrecent",
        )
        self.sleep_state = {
            state: sleep.labels(sleep_state=state, **lv)
            for state in ("awake", "weights_offloaded", "discard_all")
        }
        self.set_sleep_state(0)
        info_labels = cache_config_labels(shape, enable_prefix_caching, user_specified_block_size)
        info = _family(
            r,
            Gauge,
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            [*info_labels, "engine"],
            multiprocess_mode="mostrecent",
        )
        # One sample per engine core (loggers.py:1095-1098).
        info.labels(engine=str(engine_index), **info_labels).set(1)

    def set_sleep_state(self, level: int) -> None:
        """0 awake; 1 weights offloaded; 2 everything discarded (loggers.py, engine_sleep_state)."""
        self.sleep_state["awake"].set(1 if level == 0 else 0)
        self.sleep_state["weights_offloaded"].set(1 if level == 1 else 0)
        self.sleep_state["discard_all"].set(1 if level >= 2 else 0)

    def record_prompt(self, total: int, cached: int, recomputed_last: bool) -> None:
        """PromptTokenStats of a request whose prefill finished: all its prompt tokens count in
        vllm:prompt_tokens, split by source (vllm/v1/metrics/stats.py). `recomputed_last` is not exported:
        vLLM at 2f41c894 has no counter of recomputed cached tokens (loggers.py defines none)."""
        self.prompt_tokens.inc(total)
        self.prompt_tokens_by_source["local_compute"].inc(total - cached)
        self.prompt_tokens_by_source["local_cache_hit"].inc(cached)
        self.prompt_tokens_cached.inc(cached)


def cache_config_labels(
    shape: EngineShape, enable_prefix_caching: bool, user_specified_block_size: bool = False
) -> dict[str, str]:
    """CacheConfig.metrics_info(): every CacheConfig attribute as a string (vllm/config/cache.py).

    `user_specified_block_size`: `--block-size` was given (vllm/platforms/interface.py:628-641).
    """
    values: dict[str, object] = {
        "block_size": shape.block_size,
        "user_specified_block_size": user_specified_block_size,
        "user_specified_mamba_block_size": False,
        "prefix_match_unit": None,
        "gpu_memory_utilization": shape.gpu_memory_utilization,
        "cache_dtype": shape.kv_cache_dtype,
        "is_attention_free": False,
        "num_gpu_blocks_override": None,
        "sliding_window": None,
        "enable_prefix_caching": enable_prefix_caching,
        "prefix_caching_hash_algo": "sha256",
        "prefix_cache_retention_interval": 0,
        "kv_cache_dtype_skip_layers": [],
        "mamba_page_size_padded": None,
        "skip_page_size_padded": None,
        "mamba_block_size": None,
        "mamba_cache_dtype": "auto",
        "mamba_ssm_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "replayssm_buffer_len": 16,
        "use_replayssm": False,
        "use_kda_recoverssm": False,
        "num_gpu_blocks": shape.num_gpu_blocks,
        "num_cpu_blocks": None,
        "kv_cache_size_tokens": shape.kv_cache_size_tokens,
        "kv_cache_max_concurrency": shape.kv_cache_max_concurrency,
        "kv_sharing_fast_prefill": False,
        "kv_cache_memory_bytes": None,
        "kv_offloading_size": None,
        "kv_offloading_backend": "native",
        "_block_size_resolved": True,
    }
    return {k: str(v) for k, v in values.items()}
