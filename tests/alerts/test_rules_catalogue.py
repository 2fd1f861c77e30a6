"""The console's rules mirror deploy/prometheus/inferchain-rules.yml: one per alert, same severity,
same for-duration, and the default threshold is the number in the rule's expression."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from alerts.choices import Metric
from alerts.rules import RULES

RULES_FILE = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "inferchain-rules.yml"


def seconds(duration: str | None) -> int:
    if not duration:
        return 0
    value, unit = re.fullmatch(r"(\d+)([smh])", duration).groups()  # type: ignore[union-attr]
    return int(value) * {"s": 1, "m": 60, "h": 3600}[unit]


def test_every_prometheus_alert_has_a_console_rule_with_its_defaults() -> None:
    doc = yaml.safe_load(RULES_FILE.read_text())
    prom = {r["alert"]: r for group in doc["groups"] for r in group["rules"]}
    assert sorted(prom) == sorted(r.alert for r in RULES)
    assert sorted(r.metric for r in RULES) == sorted(Metric.values)
    for rule in RULES:
        source = prom[rule.alert]
        assert seconds(source.get("for")) == rule.for_seconds, rule.alert
        assert source["labels"]["severity"] == rule.severity, rule.alert
        if rule.threshold is None:
            continue
        numbers = {float(n) for n in re.findall(r"(?<![\w.\[])(\d+(?:\.\d+)?)(?![\w\]])", source["expr"])}
        assert rule.threshold in numbers, (rule.alert, rule.threshold, numbers)
