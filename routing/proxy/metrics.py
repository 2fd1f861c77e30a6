"""Prometheus metrics of the data plane, served at the proxy's /metrics (per process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

REQUESTS = Counter(
    "inferchain_proxy_requests",
    "Requests answered by the proxy.",
    ["alias", "deployment", "status"],
    registry=REGISTRY,
)
LATENCY = Histogram(
    "inferchain_proxy_request_seconds",
    "Total request latency as the client sees it.",
    ["alias", "deployment"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
TTFT = Histogram(
    "inferchain_proxy_ttft_seconds",
    "Time to the first byte of the upstream answer.",
    ["alias", "deployment"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
TOKENS = Counter(
    "inferchain_proxy_tokens",
    "Tokens processed, by kind (prompt or completion).",
    ["alias", "kind"],
    registry=REGISTRY,
)
ROUTE_DECISIONS = Counter(
    "inferchain_proxy_route_decisions",
    "Endpoint choices, by pool, scorer and endpoint.",
    ["pool", "scorer", "deployment"],
    registry=REGISTRY,
)
DECISION_SECONDS = Histogram(
    "inferchain_proxy_route_decision_seconds",
    "Time spent choosing a pool and an endpoint.",
    buckets=(1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 1e-3),
    registry=REGISTRY,
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
INFLIGHT = Gauge(
    "inferchain_proxy_inflight",
    "Requests in flight from this process, by deployment.",
    ["deployment"],
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
