"""Prometheus metrics of the data plane, served at the proxy's /metrics (per process).

The per-request ones (requests, latency, TTFT, tokens, route decisions, decision time, in flight)
are plain numbers updated on the event loop's thread and turned into metric families only when
/metrics is scraped (`LoopMetrics`, a prometheus_client collector): prometheus_client's own
counters take a lock per update and its histograms walk their buckets in Python, which came to
about eight lock round trips per request. The rare ones (ejections, retries, limit rejections,
spooled rows, key lookups) stay prometheus_client objects; the spool counter is updated from the
request log's thread.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

REGISTRY = CollectorRegistry(auto_describe=True)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class _CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount


class _GaugeChild(_CounterChild):
    __slots__ = ()

    def dec(self, amount: float = 1) -> None:
        self.value -= amount


class _HistogramChild:
    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value


class LoopMetric:
    """One metric with labels, updated only from the event loop's thread (no locks)."""

    def __init__(
        self, kind: str, name: str, doc: str, labels: Sequence[str] = (), buckets: Sequence[float] = ()
    ):
        self.kind, self.name, self.doc, self.labelnames = kind, name, doc, tuple(labels)
        self.buckets = tuple(float(b) for b in buckets)
        self.children: dict[tuple[str, ...], Any] = {}

    def labels(self, *values: Any) -> Any:
        key = tuple(str(v) for v in values)
        child = self.children.get(key)
        if child is None:
            if self.kind == "histogram":
                child = _HistogramChild(self.buckets)
            elif self.kind == "gauge":
                child = _GaugeChild()
            else:
                child = _CounterChild()
            self.children[key] = child
        return child

    def observe(self, value: float) -> None:  # unlabelled histograms
        self.labels().observe(value)

    def family(self) -> Any:
        if self.kind == "counter":
            fam: Any = CounterMetricFamily(self.name, self.doc, labels=self.labelnames)
            for key, child in list(self.children.items()):
                fam.add_metric(key, child.value)
        elif self.kind == "gauge":
            fam = GaugeMetricFamily(self.name, self.doc, labels=self.labelnames)
            for key, child in list(self.children.items()):
                fam.add_metric(key, child.value)
        else:
            fam = HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)
            for key, child in list(self.children.items()):
                running, buckets = 0, []
                for bound, count in zip((*self.buckets, float("inf")), child.counts, strict=True):
                    running += count
                    buckets.append((_le(bound), running))
                fam.add_metric(key, buckets, child.total)
        return fam


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


class LoopMetrics(Collector):
    def __init__(self) -> None:
        self.metrics: list[LoopMetric] = []

    def add(self, metric: LoopMetric) -> LoopMetric:
        self.metrics.append(metric)
        return metric

    def collect(self) -> Iterator[Any]:
        for metric in self.metrics:
            yield metric.family()

    def describe(self) -> Iterator[Any]:
        return iter(())  # families are built at collect time; nothing to pre-register


LOOP = LoopMetrics()
REGISTRY.register(LOOP)

REQUESTS = LOOP.add(
    LoopMetric(
        "counter",
        "inferchain_proxy_requests",
        "Requests answered by the proxy.",
        ["alias", "deployment", "status"],
    )
)
LATENCY = LOOP.add(
    LoopMetric(
        "histogram",
        "inferchain_proxy_request_seconds",
        "Total request latency as the client sees it.",
        ["alias", "deployment"],
        LATENCY_BUCKETS,
    )
)
TTFT = LOOP.add(
    LoopMetric(
        "histogram",
        "inferchain_proxy_ttft_seconds",
        "Time to the first byte of the upstream answer.",
        ["alias", "deployment"],
        LATENCY_BUCKETS,
    )
)
TOKENS = LOOP.add(
    LoopMetric(
        "counter",
        "inferchain_proxy_tokens",
        "Tokens processed, by kind (prompt or completion).",
        ["alias", "kind"],
    )
)
ROUTE_DECISIONS = LOOP.add(
    LoopMetric(
        "counter",
        "inferchain_proxy_route_decisions",
        "Endpoint choices, by pool, scorer and endpoint.",
        ["pool", "scorer", "deployment"],
    )
)
SLO_REQUESTS = LOOP.add(
    LoopMetric(
        "counter",
        "inferchain_proxy_slo_requests",
        "Answered streams by pool and SLO class, and whether they met the class's TTFT and time per "
        "output token targets (met, missed), plus batch requests shed because no engine was predicted "
        "to meet them (shed) and other requests moved to the policy's fallback pool for that reason "
        "(fallback, under the pool they left). Goodput per class is the rate of `met`.",
        ["pool", "slo_class", "outcome"],
    )
)
DECISION_SECONDS = LOOP.add(
    LoopMetric(
        "histogram",
        "inferchain_proxy_route_decision_seconds",
        "Time spent choosing a pool and an endpoint.",
        (),
        (1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 1e-3),
    )
)
INFLIGHT = LOOP.add(
    LoopMetric(
        "gauge",
        "inferchain_proxy_inflight",
        "Requests in flight from this process, by deployment.",
        ["deployment"],
    )
)
# Per model version, so a canary can be watched beside its primary. Labels are bounded: aliases and
# versions with a ready deployment (only requests that reached an engine are counted here), `arm`
# "primary" or "canary", `code` the status class ("2xx", "4xx", "5xx").
VERSION_REQUESTS = LOOP.add(
    LoopMetric(
        "counter",
        "inferchain_proxy_version_requests",
        "Requests answered by an engine, by alias, model version, arm (primary or canary) and status class.",
        ["alias", "version", "arm", "code"],
    )
)
VERSION_LATENCY = LOOP.add(
    LoopMetric(
        "histogram",
        "inferchain_proxy_version_request_seconds",
        "Total request latency as the client sees it, by alias, model version and arm.",
        ["alias", "version", "arm"],
        LATENCY_BUCKETS,
    )
)
VERSION_TTFT = LOOP.add(
    LoopMetric(
        "histogram",
        "inferchain_proxy_version_ttft_seconds",
        "Time to the first generated text of streamed answers, by alias, model version and arm.",
        ["alias", "version", "arm"],
        LATENCY_BUCKETS,
    )
)
CANARY_DRAWS = LOOP.add(
    LoopMetric(
        "counter",
        "inferchain_proxy_canary_draws",
        "Requests of a pool with an active rollout, by outcome: baseline, candidate, "
        "candidate_unavailable (drawn for the candidate, none of its endpoints could take it: baseline), "
        "candidate_unreachable (of the candidate draws, those whose candidate could not be connected to "
        "and that the baseline answered).",
        ["alias", "outcome"],
    )
)
SHADOW_MIRRORS = LOOP.add(
    LoopMetric(
        "counter",
        "inferchain_proxy_shadow_mirrors",
        "Mirrored (shadow) requests sent to a candidate version, by outcome (ok, error, timeout).",
        ["alias", "version", "outcome"],
    )
)
SHADOW_SKIPPED = LOOP.add(
    LoopMetric(
        "counter",
        "inferchain_proxy_shadow_skipped",
        "Requests drawn for mirroring but not mirrored, by reason (max_inflight, saturated, unavailable, "
        "no_endpoint, primary_failed).",
        ["alias", "reason"],
    )
)
SHADOW_LATENCY = LOOP.add(
    LoopMetric(
        "histogram",
        "inferchain_proxy_shadow_request_seconds",
        "Latency of mirrored requests at the candidate, by alias and model version.",
        ["alias", "version"],
        LATENCY_BUCKETS,
    )
)
# Per pool and request length, and per tenant, for success-rate and latency by request kind (docs/
# monitoring.md). Bounded: pools and tenants are configured objects (an unauthenticated request counts
# under tenant ""), `length` is "short" or "long" (prompt tokens against PROXY_LONG_PROMPT_TOKENS), `code`
# the status class. Per deployment: inferchain_proxy_requests/_request_seconds above.
POOL_REQUESTS = LOOP.add(
    LoopMetric(
        "counter",
        "inferchain_proxy_pool_requests",
        "Requests routed to a pool, by pool, prompt length (short or long) and status class.",
        ["pool", "length", "code"],
    )
)
POOL_LATENCY = LOOP.add(
    LoopMetric(
        "histogram",
        "inferchain_proxy_pool_request_seconds",
        "Total request latency as the client sees it, by pool and prompt length (short or long).",
        ["pool", "length"],
        LATENCY_BUCKETS,
    )
)
TENANT_REQUESTS = LOOP.add(
    LoopMetric(
        "counter",
        "inferchain_proxy_tenant_requests",
        "Requests answered by the proxy, by tenant and status class.",
        ["tenant", "code"],
    )
)
TENANT_LATENCY = LOOP.add(
    LoopMetric(
        "histogram",
        "inferchain_proxy_tenant_request_seconds",
        "Total request latency as the client sees it, by tenant.",
        ["tenant"],
        LATENCY_BUCKETS,
    )
)
TENANT_TOKENS = LOOP.add(
    LoopMetric(
        "counter",
        "inferchain_proxy_tenant_tokens",
        "Tokens processed for a tenant, by kind (prompt or completion).",
        ["tenant", "kind"],
    )
)
EJECTIONS = Counter(
    "inferchain_proxy_ejections",
    "Endpoints ejected by the circuit breaker.",
    ["deployment"],
    registry=REGISTRY,
)
RETRIES = Counter(
    "inferchain_proxy_retries", "Requests retried on another endpoint.", ["alias"], registry=REGISTRY
)
LIMIT_REJECTIONS = Counter(
    "inferchain_proxy_limit_rejections",
    "Requests refused by admission control, by reason.",
    ["reason"],
    registry=REGISTRY,
)
REQUEST_LOG_SPOOLED = Counter(
    "inferchain_proxy_request_log_spooled",
    "Request-log rows spooled to disk because the database was unavailable.",
    registry=REGISTRY,
)
KEY_LOOKUPS = Counter(
    "inferchain_proxy_key_lookups",
    "API-key cache misses in this process, by where the key was resolved (redis, db).",
    ["source"],
    registry=REGISTRY,
)
# Chain stages (routing/proxy/pipeline/stages.py): time per hook and outcome per request, by chain and
# stage name (both configured objects, so bounded). `hook`: request, response or chunks (the sum of a
# request's chunk calls); `outcome`: pass, masked, blocked, refused (a ProxyError) or error (it raised).
STAGE_SECONDS = LOOP.add(
    LoopMetric(
        "histogram",
        "inferchain_proxy_stage_seconds",
        "Time in one chain stage's hook per request, by chain, stage and hook.",
        ["chain", "stage", "hook"],
        (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1),
    )
)
STAGE_OUTCOMES = LOOP.add(
    LoopMetric(
        "counter",
        "inferchain_proxy_stage_outcomes",
        "Requests through a chain stage, by chain, stage and outcome.",
        ["chain", "stage", "outcome"],
    )
)
# The cache stage (routing/proxy/answercache.py), by chain and stage name. `result` of a lookup: hit,
# miss (also when Redis failed: the request went on to the engine), bypass (the client's header), skip
# (not a deterministic request); of a store: stored, too_large, not_replayable, failed.
CACHE_LOOKUPS = LOOP.add(
    LoopMetric(
        "counter",
        "inferchain_proxy_cache_lookups",
        "Requests through a cache stage, by chain, stage and result (hit, miss, bypass, skip).",
        ["chain", "stage", "result"],
    )
)
CACHE_STORES = LOOP.add(
    LoopMetric(
        "counter",
        "inferchain_proxy_cache_stores",
        "Answers a cache stage tried to store, by chain, stage and result.",
        ["chain", "stage", "result"],
    )
)
CACHE_EVICTIONS = LOOP.add(
    LoopMetric(
        "counter",
        "inferchain_proxy_cache_evictions",
        "Entries a cache stage evicted to keep a tenant within its entry or byte bound.",
        ["chain", "stage"],
    )
)
