"""The fleet's health in one answer, what the dashboard shows before anything else: the request figures
(rate, errors by status class, latency and TTFT percentiles) of the fleet and each pool over a window,
from routing's rollups, and the hosts down, named, each with its InferchainHostDown alert.

It lives in the alerts app because it is the one domain app that may read all three (routing's
history, nodes' hosts and its own alerts; docs/architecture.md), and the colours the console puts on the
error rate follow the alert rule's threshold, so the panel turns red where the alert would fire. Cost:
the rollup read of routing.rollups.health (one indexed range read, whatever the request log's size), one
count and one page of the hosts down, one read of their open alerts.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from alerts.choices import AlertState, Metric
from alerts.conditions import fingerprint
from alerts.models import Alert, AlertRule
from alerts.rules import BY_METRIC
from nodes.fleet_summary import down_hosts_filter
from nodes.models import Host
from routing.rollups import health

HOSTS_DEFAULT = 20
HOSTS_MAX = 100
# Below this share of errors the panel stays calm; from it up to the alert's threshold it warns.
ERROR_RATE_WARN = 0.01


def fleet_health(window: str, now: dt.datetime, hosts: int = HOSTS_DEFAULT) -> dict[str, Any]:
    """Request figures of the fleet and its pools over `window`, the first `hosts` hosts down (by name)
    with their alerts, and the error-rate thresholds the console colours by."""
    body = health.read_health(window, now)
    body["hosts_down"] = hosts_down(now, hosts)
    body["thresholds"] = {"error_rate_warn": ERROR_RATE_WARN, "error_rate_critical": error_rate_critical()}
    return body


def hosts_down(now: dt.datetime, limit: int) -> dict[str, Any]:
    """How many hosts are down, and the first `limit` by name with their last heartbeat and the
    InferchainHostDown alert open on them (pending or firing), else the latest one, if any."""
    down = Host.objects.filter(down_hosts_filter(now))
    named = list(down.order_by("name").values_list("name", "last_heartbeat")[:limit])
    prints = {fingerprint(Metric.HOST_DOWN, {"host": name}): name for name, _ in named}
    alerts: dict[str, Alert] = {}
    # Newest first, so an open alert (or else the latest resolved one) is the one kept per host.
    for alert in Alert.objects.filter(metric=Metric.HOST_DOWN, fingerprint__in=list(prints)).order_by(
        "-started_at", "-id"
    ):
        name = prints[alert.fingerprint]
        kept = alerts.get(name)
        if kept is None or (alert.state != AlertState.RESOLVED and kept.state == AlertState.RESOLVED):
            alerts[name] = alert
    return {
        "count": down.count(),
        "hosts": [
            {"name": name, "last_heartbeat": seen, "alert": _alert(alerts.get(name))} for name, seen in named
        ],
    }


def _alert(alert: Alert | None) -> dict[str, Any] | None:
    if alert is None:
        return None
    return {
        "id": alert.pk,
        "state": alert.state,
        "severity": alert.severity,
        "started_at": alert.started_at,
        "fired_at": alert.fired_at,
    }


def error_rate_critical() -> float:
    """The fleet-wide InferchainHigh5xxRatio threshold (as edited in the console, else the default)."""
    threshold = (
        AlertRule.objects.filter(metric=Metric.HIGH_5XX_RATIO, deployment=None, pool=None)
        .values_list("threshold", flat=True)
        .first()
    )
    default = BY_METRIC[Metric.HIGH_5XX_RATIO].threshold
    return float(threshold if threshold is not None else default or 0.05)
