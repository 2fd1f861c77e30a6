"""The proxy's lock-free per-request metrics render exactly as Prometheus expects."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from routing.proxy.metrics import LoopMetric, LoopMetrics


def _samples(collector: LoopMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_histogram_buckets_are_cumulative_and_bounds_inclusive() -> None:
    loop = LoopMetrics()
    hist = loop.add(LoopMetric("histogram", "t_seconds", "doc", ["alias"], (0.1, 1.0)))
    child = hist.labels("a")
    for value in (0.05, 0.1, 0.5, 1.0, 7.0):
        child.observe(value)
    got = _samples(loop)
    assert got[("t_seconds_bucket", (("alias", "a"), ("le", "0.1")))] == 2  # 0.05 and exactly 0.1
    assert got[("t_seconds_bucket", (("alias", "a"), ("le", "1.0")))] == 4
    assert got[("t_seconds_bucket", (("alias", "a"), ("le", "+Inf")))] == 5
    assert got[("t_seconds_count", (("alias", "a"),))] == 5
    assert abs(got[("t_seconds_sum", (("alias", "a"),))] - 8.65) < 1e-9


def test_counters_and_gauges_keep_one_child_per_label_set() -> None:
    loop = LoopMetrics()
    requests = loop.add(LoopMetric("counter", "t_requests", "doc", ["alias", "status"]))
    inflight = loop.add(LoopMetric("gauge", "t_inflight", "doc", ["deployment"]))
    requests.labels("a", 200).inc()
    requests.labels("a", "200").inc(2)  # labels are strings: 200 and "200" are one child
    requests.labels("b", 500).inc()
    gauge = inflight.labels(7)
    gauge.inc()
    gauge.inc()
    gauge.dec()
    got = _samples(loop)
    assert got[("t_requests_total", (("alias", "a"), ("status", "200")))] == 3
    assert got[("t_requests_total", (("alias", "b"), ("status", "500")))] == 1
    assert got[("t_inflight", (("deployment", "7"),))] == 1
