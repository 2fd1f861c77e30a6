"""The rules' conditions on what the control plane has: which alerts hold now, with their values.

One evaluation reads the fleet the Prometheus exposition shows (alerts.fleet: the rows and live records
of `routing.fleet_metrics.read_state`, only the columns the rules use), the request log's last five
minutes per alias (one grouped query), and the short series in Redis (alerts.samples). Each condition
mirrors its rule in deploy/prometheus/inferchain-rules.yml; thresholds come from the rule that applies
to the subject (RuleBook).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, Q

from alerts import samples
from alerts.choices import Metric
from alerts.fleet import DeploymentInfo, RuleFleet
from alerts.models import AlertRule
from alerts.rules import (
    BASELINE_SKIP_SECONDS,
    BASELINE_SPAN_SECONDS,
    BY_METRIC,
    CRASH_WINDOW_SECONDS,
    ERROR_WINDOW_SECONDS,
    QUEUE_WINDOW_SECONDS,
    TTFT_FLOOR_SECONDS,
)
from nodes.choices import DeploymentState, DesiredState
from routing.models import RequestLog, RoutePool


@dataclass(frozen=True)
class Effective:
    """The rule that applies to one subject."""

    threshold: float | None
    for_seconds: int
    enabled: bool
    rule_id: int | None


class RuleBook:
    """Rule rows by scope: deployment override, then pool override, then the fleet-wide row."""

    def __init__(self, rows: Iterable[AlertRule], pools: Iterable[RoutePool]) -> None:
        self.fleet: dict[str, AlertRule] = {}
        self.by_deployment: dict[tuple[str, int], AlertRule] = {}
        self.by_pool: dict[tuple[str, int], AlertRule] = {}
        for row in rows:
            if row.deployment_id:
                self.by_deployment[(row.metric, row.deployment_id)] = row
            elif row.pool_id:
                self.by_pool[(row.metric, row.pool_id)] = row
            else:
                self.fleet[row.metric] = row
        self.pools = sorted(pools, key=lambda p: p.name)
        # Per metric, the pools with an override, in name order: at 5,000 deployments x 5 rules a run,
        # each lookup walks only these (usually none) and reuses one Effective per rule row.
        self.pool_rows: dict[str, list[tuple[RoutePool, AlertRule]]] = {}
        for pool in self.pools:
            for (metric, pool_id), row in self.by_pool.items():
                if pool_id == pool.pk:
                    self.pool_rows.setdefault(metric, []).append((pool, row))
        self._made: dict[tuple[str, int | None], Effective] = {}
        # Metrics with no override narrower than the fleet: the usual case, answered without a walk.
        self._narrowed = {metric for metric, _ in self.by_deployment} | set(self.pool_rows)

    @staticmethod
    def _effective(row: AlertRule | None, metric: str) -> Effective:
        if row is None:
            d = BY_METRIC[metric]
            return Effective(d.threshold, d.for_seconds, True, None)
        return Effective(row.threshold, row.for_seconds, row.enabled, row.pk)

    def _of(self, row: AlertRule | None, metric: str) -> Effective:
        """`_effective`, made once per rule row (Effective is frozen: sharing it is safe)."""
        made_key = (metric, None if row is None else row.pk)
        found = self._made.get(made_key)
        if found is None:
            found = self._made[made_key] = self._effective(row, metric)
        return found

    def for_fleet(self, metric: str) -> Effective:
        return self._of(self.fleet.get(metric), metric)

    def wants_gpus(self) -> bool:
        """Whether a GPU rule is on (they take the fleet-wide row only): else the GPUs are not read."""
        return any(
            self.for_fleet(m).enabled and self.for_fleet(m).threshold is not None
            for m in (Metric.GPU_MEMORY_HIGH, Metric.GPU_TEMPERATURE_HIGH)
        )

    def wants_tenants(self) -> bool:
        """Whether the budget rule is on (fleet-wide row only): else the tenants are not read."""
        rule = self.for_fleet(Metric.TENANT_NEAR_BUDGET)
        return rule.enabled and rule.threshold is not None

    def for_alias(self, metric: str, alias: str) -> Effective:
        for pool, row in self.pool_rows.get(metric, ()):
            if pool.alias == alias:
                return self._of(row, metric)
        return self.for_fleet(metric)

    def deployment_rules(self, metric: str) -> Callable[[DeploymentInfo], Effective]:
        """`for_deployment` for one metric, as a function of the deployment: with no override narrower
        than the fleet's (the usual case) it returns the one fleet rule without a lookup per call (5,000
        engines x 5 rules a run)."""
        if metric in self._narrowed:
            return lambda dep: self.for_deployment(metric, dep)
        fleet = self.for_fleet(metric)
        return lambda _dep: fleet

    def for_deployment(self, metric: str, dep: DeploymentInfo) -> Effective:
        if metric not in self._narrowed:
            return self.for_fleet(metric)
        row = self.by_deployment.get((metric, dep.pk))
        if row is not None:
            return self._of(row, metric)
        # A pool holds the ready deployments serving its alias (with its role, and its version if pinned);
        # when several pools with an override hold the deployment, the first by name applies.
        for pool, row in self.pool_rows.get(metric, ()):
            if (
                pool.alias == dep.alias
                and (not pool.role or pool.role == dep.role)
                and (pool.model_version_id is None or pool.model_version_id == dep.version_id)
            ):
                return self._of(row, metric)
        return self.for_fleet(metric)


@dataclass
class Observation:
    """A condition that holds now on one subject."""

    metric: str
    subject: str
    labels: dict[str, str]
    value: float | None
    rule: Effective
    summary: str
    fingerprint: str = field(init=False)

    def __post_init__(self) -> None:
        self.fingerprint = fingerprint(self.metric, self.labels)


def fingerprint(metric: str, labels: dict[str, str]) -> str:
    """What names one condition on one subject: `host_down:host=gpu-7`."""
    return f"{metric}:{','.join(f'{k}={v}' for k, v in sorted(labels.items()))}"[:300]


def _num(value: Any) -> float | None:
    """A live record's number; None for a missing or non-numeric value (a bool is not a number here)."""
    kind = type(value)
    if kind is float:  # what the agent writes: answered first, ~40,000 times a run at 1,000 hosts
        return value
    if kind is int:
        return float(value)
    if value is None or kind is bool:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _pct(value: float) -> str:
    return f"{value * 100:.1f}%"


def observe(fleet: RuleFleet, book: RuleBook, now: float) -> list[Observation]:
    """Every condition that holds at `now` under its enabled rule (records the range series as it goes).

    At 1,000 hosts x 8 GPUs and 5,000 engines the loops below run 13,000 times a run and nearly every
    subject is healthy, so each condition's labels, words and (for the deployment rules) rule are made
    only once its numbers hold."""
    out: list[Observation] = []

    def add(
        metric: str, rule: Effective, subject: str, labels: dict[str, str], value: float | None, text: str
    ) -> None:
        if rule.enabled:
            out.append(Observation(metric, subject, labels, value, rule, text))

    rule = book.for_fleet(Metric.HOST_DOWN)
    for host, up in fleet.hosts:
        if not up:
            add(
                Metric.HOST_DOWN, rule, f"host {host}", {"host": host}, 0.0, f"Host {host} sends no heartbeat"
            )

    mem_rule = book.for_fleet(Metric.GPU_MEMORY_HIGH)
    temp_rule = book.for_fleet(Metric.GPU_TEMPERATURE_HIGH)
    mem_max, temp_max = mem_rule.threshold, temp_rule.threshold
    for host, index, sample in fleet.gpus:
        if mem_max is not None:
            used, total = _num(sample.get("memory_used_bytes")), _num(sample.get("memory_total_bytes"))
            if used is not None and total and used / total > mem_max:
                ratio = used / total
                add(
                    Metric.GPU_MEMORY_HIGH,
                    mem_rule,
                    f"GPU {index} of {host}",
                    {"host": host, "gpu": str(index)},
                    ratio,
                    f"GPU {index} of {host} is {_pct(ratio)} full",
                )
        if temp_max is not None:
            temp = _num(sample.get("temperature_c"))
            if temp is not None and temp > temp_max:
                add(
                    Metric.GPU_TEMPERATURE_HIGH,
                    temp_rule,
                    f"GPU {index} of {host}",
                    {"host": host, "gpu": str(index)},
                    temp,
                    f"GPU {index} of {host} at {temp:g} °C",
                )

    # Each deployment rule resolved once a run where no override narrows it (the usual case).
    engine_down = book.deployment_rules(Metric.ENGINE_DOWN)
    crash_looping = book.deployment_rules(Metric.ENGINE_CRASH_LOOPING)
    kv_saturated = book.deployment_rules(Metric.KV_CACHE_SATURATED)
    queue_growing = book.deployment_rules(Metric.QUEUE_GROWING)
    ttft_over = book.deployment_rules(Metric.TTFT_P95_OVER_BASELINE)

    restarts: dict[str, float] = {}
    waiting: dict[str, float] = {}
    ttft: dict[str, float] = {}
    growing: set[str] = set()  # over the queue threshold: the only ones whose whole window is read
    # (subject, deployment, live record, its scraped numbers: None for an engine without /metrics)
    keyed: list[tuple[str, DeploymentInfo, dict[str, Any] | None, dict[str, Any] | None]] = []
    for dep, live in fleet.deployments:
        k = str(dep.pk)
        restarts[k] = float(dep.restarts_total)
        scraped = live if live is not None and live.get("has_metrics", True) else None
        keyed.append((k, dep, live, scraped))
        if scraped is not None:
            w = _num(scraped.get("num_requests_waiting"))
            if w is not None:
                waiting[k] = w
                queue_max = queue_growing(dep).threshold
                if queue_max is not None and w > queue_max:
                    growing.add(k)
            t = _num(scraped.get("ttft_p95_s"))
            if t is not None:
                ttft[k] = t
    # Every sample is recorded; only what a condition below can use is read back: the ends of the
    # restart windows, the queue windows over their threshold, the baselines of a p95 over the floor.
    restart_windows = samples.record_windows("restarts", restarts, now, CRASH_WINDOW_SECONDS, full=())
    queue_windows = samples.record_windows("waiting", waiting, now, QUEUE_WINDOW_SECONDS, full=growing)
    baselines = samples.record_baselines(
        ttft,
        now,
        BASELINE_SKIP_SECONDS,
        BASELINE_SPAN_SECONDS,
        wanted={k for k, t in ttft.items() if t > TTFT_FLOOR_SECONDS},
    )

    def about(dep: DeploymentInfo) -> tuple[dict[str, str], str]:
        """An alert's labels and its subject's words: made only for a condition that holds."""
        return {"deployment": dep.name, "alias": dep.alias, "host": dep.host}, f"{dep.name} on {dep.host}"

    for k, dep, live, scraped in keyed:
        if dep.desired_state == DesiredState.RUNNING and not (
            dep.state == DeploymentState.READY and live is not None
        ):
            labels, where = about(dep)
            add(
                Metric.ENGINE_DOWN,
                engine_down(dep),
                f"deployment {where}",
                labels,
                0.0,
                f"Engine {where} is down ({dep.state})",
            )

        window = restart_windows.get(k)
        if window:
            increase = window[-1][1] - window[0][1]
            rule = crash_looping(dep)
            if rule.threshold is not None and increase >= rule.threshold:
                labels, where = about(dep)
                add(
                    Metric.ENGINE_CRASH_LOOPING,
                    rule,
                    f"deployment {where}",
                    labels,
                    increase,
                    f"Engine {where} restarted {increase:.0f} times in 15 minutes",
                )

        kv = _num(scraped.get("kv_cache_usage_perc")) if scraped is not None else None
        if kv is not None:
            rule = kv_saturated(dep)
            if rule.threshold is not None and kv > rule.threshold:
                labels, where = about(dep)
                add(
                    Metric.KV_CACHE_SATURATED,
                    rule,
                    f"deployment {where}",
                    labels,
                    kv,
                    f"KV cache of {dep.name} at {_pct(kv)}",
                )

        if k in growing:  # waiting over its rule's threshold
            growth = samples.slope(queue_windows.get(k, []))
            if growth is not None and growth > 0:
                labels, where = about(dep)
                add(
                    Metric.QUEUE_GROWING,
                    queue_growing(dep),
                    f"deployment {where}",
                    labels,
                    waiting[k],
                    f"Queue of {dep.name} keeps growing ({waiting[k]:.0f} waiting)",
                )

        base = baselines.get(k)
        if base is not None:  # only a p95 over the floor, with a day behind it, has one
            rule = ttft_over(dep)
            value = ttft[k]
            if rule.threshold is not None and value > TTFT_FLOOR_SECONDS and value > rule.threshold * base:
                labels, where = about(dep)
                add(
                    Metric.TTFT_P95_OVER_BASELINE,
                    rule,
                    f"deployment {where}",
                    labels,
                    value,
                    f"TTFT p95 of {dep.name} is {value:.2f} s, over {rule.threshold:g}x "
                    f"its baseline {base:.2f} s",
                )

    since = dt.datetime.fromtimestamp(now - ERROR_WINDOW_SECONDS, dt.UTC)
    until = dt.datetime.fromtimestamp(now, dt.UTC)
    rows = (
        RequestLog.objects.filter(created_at__gt=since, created_at__lte=until)
        .exclude(alias="")
        .values("alias")
        .annotate(total=Count("id"), errors=Count("id", filter=Q(status__gte=500)))
    )
    for row in rows:
        rule = book.for_alias(Metric.HIGH_5XX_RATIO, row["alias"])
        if row["total"] and rule.threshold is not None:
            ratio = row["errors"] / row["total"]
            if ratio > rule.threshold:
                add(
                    Metric.HIGH_5XX_RATIO,
                    rule,
                    f"alias {row['alias']}",
                    {"alias": row["alias"]},
                    ratio,
                    f"{_pct(ratio)} of requests for {row['alias']} fail with 5xx",
                )

    rule = book.for_fleet(Metric.TENANT_NEAR_BUDGET)
    for tenant, budget, used in fleet.tenants:
        if budget > 0 and rule.threshold is not None and used / budget > rule.threshold:
            ratio = used / budget
            add(
                Metric.TENANT_NEAR_BUDGET,
                rule,
                f"tenant {tenant}",
                {"tenant": tenant},
                ratio,
                f"Tenant {tenant} used {_pct(ratio)} of its daily token budget",
            )
    return out
