"""The rule catalogue: one entry per alert of deploy/prometheus/inferchain-rules.yml, with its defaults.

The thresholds and for-durations here are the rules file's (tests/alerts/test_rules_catalogue.py reads
the YAML and compares), so a team that moves from these console alerts to Alertmanager gets the same
pages. Each deployment or pool may override a rule (AlertRule rows); hosts, GPUs and tenants take the
fleet-wide row only.
"""

from __future__ import annotations

from dataclasses import dataclass

from alerts.choices import Metric, Severity

DEPLOYMENT = "deployment"
POOL = "pool"

# The TTFT rule's floor: an idle, fast engine whose p95 doubles from 0.1 s to 0.2 s is noise, not a page.
TTFT_FLOOR_SECONDS = 0.5
# Windows of the rules file's range queries.
CRASH_WINDOW_SECONDS = 15 * 60
QUEUE_WINDOW_SECONDS = 5 * 60
ERROR_WINDOW_SECONDS = 5 * 60
# TTFT baseline: the previous day, skipping the last hour (`[1d] offset 1h`).
BASELINE_SKIP_SECONDS = 3600
BASELINE_SPAN_SECONDS = 24 * 3600
MAX_FOR_SECONDS = 7 * 24 * 3600


@dataclass(frozen=True)
class RuleDef:
    metric: str
    alert: str  # the Prometheus alert's name
    severity: str
    threshold: float | None  # None: the condition has no number to tune (down or not)
    threshold_max: float | None  # ratios stop at 1
    unit: str
    for_seconds: int
    scopes: tuple[str, ...]  # what an override may name besides the fleet-wide row
    condition: str

    def as_dict(self) -> dict[str, object]:
        return {
            "metric": self.metric,
            "alert": self.alert,
            "title": Metric(self.metric).label,
            "severity": self.severity,
            "threshold": self.threshold,
            "threshold_max": self.threshold_max,
            "unit": self.unit,
            "for_seconds": self.for_seconds,
            "scopes": list(self.scopes),
            "condition": self.condition,
        }


RULES: tuple[RuleDef, ...] = (
    RuleDef(
        Metric.ENGINE_DOWN,
        "InferchainEngineDown",
        Severity.CRITICAL,
        None,
        None,
        "",
        120,
        (DEPLOYMENT, POOL),
        "A deployment meant to run is not ready, or its agent's live record expired.",
    ),
    RuleDef(
        Metric.ENGINE_CRASH_LOOPING,
        "InferchainEngineCrashLooping",
        Severity.CRITICAL,
        3.0,
        None,
        "restarts in 15 min",
        0,
        (DEPLOYMENT, POOL),
        "The engine restarted at least this many times in the last 15 minutes.",
    ),
    RuleDef(
        Metric.HOST_DOWN,
        "InferchainHostDown",
        Severity.CRITICAL,
        None,
        None,
        "",
        60,
        (),
        "The host's agent sent no heartbeat within NODE_UNREACHABLE_SECONDS.",
    ),
    RuleDef(
        Metric.GPU_MEMORY_HIGH,
        "InferchainGpuMemoryHigh",
        Severity.WARNING,
        0.97,
        1.0,
        "ratio of memory used",
        300,
        (),
        "GPU memory used over total above the threshold (vLLM reserves 0.9 by design).",
    ),
    RuleDef(
        Metric.GPU_TEMPERATURE_HIGH,
        "InferchainGpuTemperatureHigh",
        Severity.WARNING,
        85.0,
        200.0,
        "°C",
        300,
        (),
        "GPU temperature above the threshold.",
    ),
    RuleDef(
        Metric.KV_CACHE_SATURATED,
        "InferchainKvCacheSaturated",
        Severity.WARNING,
        0.95,
        1.0,
        "ratio of KV cache used",
        300,
        (DEPLOYMENT, POOL),
        "The engine's KV cache usage above the threshold.",
    ),
    RuleDef(
        Metric.QUEUE_GROWING,
        "InferchainQueueGrowing",
        Severity.WARNING,
        10.0,
        None,
        "requests waiting",
        300,
        (DEPLOYMENT, POOL),
        "More requests than the threshold wait in the engine and the queue grew over the last 5 minutes.",
    ),
    RuleDef(
        Metric.TTFT_P95_OVER_BASELINE,
        "InferchainTtftP95OverBaseline",
        Severity.WARNING,
        2.0,
        None,
        "times the baseline",
        600,
        (DEPLOYMENT, POOL),
        "The engine's TTFT p95 is above 0.5 s and above this multiple of its average over the previous "
        "day (skipping the last hour).",
    ),
    RuleDef(
        Metric.HIGH_5XX_RATIO,
        "InferchainHigh5xxRatio",
        Severity.CRITICAL,
        0.05,
        1.0,
        "ratio of requests",
        300,
        (POOL,),
        "The share of an alias's requests answered 5xx over the last 5 minutes (request log) above the "
        "threshold.",
    ),
    RuleDef(
        Metric.TENANT_NEAR_BUDGET,
        "InferchainTenantNearBudget",
        Severity.INFO,
        0.9,
        None,
        "ratio of the daily budget",
        0,
        (),
        "A tenant used more than this share of its daily token budget.",
    ),
)
BY_METRIC: dict[str, RuleDef] = {r.metric: r for r in RULES}
