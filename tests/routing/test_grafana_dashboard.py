"""docs/grafana-dashboard.json is a valid dashboard whose every query names metrics that exist.

Every panel's PromQL (all rows: proxy, model versions, GPUs, engines, pools, tenants) and every template
variable's query must name only metrics the control plane (`routing.fleet_metrics.METRICS`) or the
proxy (`routing.proxy.metrics.REGISTRY`) exports, and filter only on labels those metrics carry: a
renamed metric or label fails here instead of leaving a panel silently empty.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client import Counter

from routing import fleet_metrics
from routing.proxy import metrics as proxy_metrics

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "docs" / "grafana-dashboard.json"

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^{}]*)\}")
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"')
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are not functions, aggregations,
    keywords, label names (in matchers or grouping clauses), durations or number exponents."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        before = text[match.start() - 1] if match.start() else " "
        if before.isalnum() or before in "._":
            continue  # the exponent of a number (1e-6) or a duration's unit (5m)
        if text[match.end() :].lstrip().startswith("("):
            continue  # a function or an aggregation operator
        if match.group().lower() in _KEYWORDS:
            continue
        names.add(match.group())
    return names


def selector_labels(expr: str) -> list[tuple[str, set[str]]]:
    """(metric, label names it is filtered on) for each `metric{...}` in the expression."""
    return [(name, set(_MATCHER.findall(body))) for name, body in _SELECTOR.findall(expr)]


def grouping_labels(expr: str) -> set[str]:
    return {
        label.strip()
        for labels in _GROUPING.findall(_STRING.sub('""', expr))
        for label in labels.split(",")
        if label.strip()
    }


def exported() -> dict[str, set[str]]:
    """Every sample name the control plane and the proxy expose, with the labels it carries."""
    samples: dict[str, set[str]] = {}
    for doc in fleet_metrics.METRICS:
        for name in fleet_metrics.names_with_samples(doc.kind, doc.name):
            samples[name] = set(doc.labels)
    families: list[tuple[str, str, tuple[str, ...]]] = [
        (m.name, m.kind, m.labelnames) for m in proxy_metrics.LOOP.metrics
    ]
    families += [
        (value._name, "counter", tuple(value._labelnames))
        for value in vars(proxy_metrics).values()
        if isinstance(value, Counter)
    ]
    registered = {family.name for family in proxy_metrics.REGISTRY.collect()}
    for name, kind, labels in families:
        assert name in registered, f"{name} is declared but not in the proxy's registry"
        if kind == "counter":
            samples[name + "_total"] = set(labels)
        elif kind == "histogram":
            samples[name + "_bucket"] = {*labels, "le"}
            samples[name + "_sum"] = samples[name + "_count"] = set(labels)
        else:
            samples[name] = set(labels)
    return samples


def all_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    panels = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))  # a collapsed row keeps its panels inside it
    return panels


def test_metric_name_parser() -> None:
    expr = (
        "histogram_quantile(0.95, sum by (le, pool, length) "
        '(rate(inferchain_proxy_pool_request_seconds_bucket{pool=~"$pool",code!="5xx"}[5m])))'
        " / on (host, gpu) group_left (simulated) inferchain_gpu_info"
        " * 1e-6 > bool 0.5 offset 5m"
    )
    assert metric_names(expr) == {"inferchain_proxy_pool_request_seconds_bucket", "inferchain_gpu_info"}
    assert selector_labels(expr) == [("inferchain_proxy_pool_request_seconds_bucket", {"pool", "code"})]
    assert grouping_labels(expr) == {"le", "pool", "length", "host", "gpu", "simulated"}
    assert metric_names('up{job="a{b}"} and nope_total') == {"up", "nope_total"}


def query_problems(dashboard: dict[str, Any], samples: dict[str, set[str]]) -> list[str]:
    """What is wrong with the panels' queries: unknown metrics, labels a metric does not carry."""
    problems = []
    for panel in all_panels(dashboard):
        for target in panel.get("targets", []):
            expr, title = target["expr"], panel["title"]
            names = metric_names(expr)
            if not names:
                problems.append(f"{title!r}: no metric in {expr!r}")
            unknown = names - set(samples)
            if unknown:
                problems.append(f"{title!r} queries {sorted(unknown)}, which nothing exports")
                continue
            for name, labels in selector_labels(expr):
                if labels - samples[name]:
                    problems.append(f"{title!r}: {name} has no label {sorted(labels - samples[name])}")
            carried = set().union(*(samples[n] for n in names))
            if grouping_labels(expr) - carried:
                problems.append(f"{title!r} groups by {sorted(grouping_labels(expr) - carried)}")
    return problems


def test_every_panel_queries_exported_metrics_and_labels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    samples = exported()
    assert query_problems(dashboard, samples) == []
    queried = {
        name
        for panel in all_panels(dashboard)
        for target in panel.get("targets", [])
        for name in metric_names(target["expr"])
    }
    # The rows the dashboard promises: GPU, engine and per-tenant metrics are all on it.
    for name in (
        "inferchain_gpu_memory_used_bytes",
        "inferchain_gpu_memory_total_bytes",
        "inferchain_gpu_utilization_ratio",
        "inferchain_gpu_temperature_celsius",
        "inferchain_gpu_power_watts",
        "inferchain_gpu_info",
        "inferchain_deployment_up",
        "inferchain_deployment_state",
        "inferchain_deployment_restarts_total",
        "inferchain_engine_requests_running",
        "inferchain_engine_requests_waiting",
        "inferchain_engine_kv_cache_usage_ratio",
        "inferchain_engine_prefix_cache_hits_total",
        "inferchain_engine_generation_tokens_per_second",
        "inferchain_engine_ttft_seconds",
        "inferchain_engine_itl_seconds",
        "inferchain_proxy_pool_requests_total",
        "inferchain_proxy_pool_request_seconds_bucket",
        "inferchain_proxy_tenant_requests_total",
        "inferchain_proxy_tenant_request_seconds_bucket",
        "inferchain_proxy_tenant_tokens_total",
        "inferchain_tenant_daily_tokens_used",
        "inferchain_tenant_daily_token_budget",
    ):
        assert name in queried, f"no panel shows {name}"


def test_dashboard_is_a_valid_grafana_dashboard() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"host", "deployment", "tenant"} <= set(variables)
    samples = exported()
    for variable in variables.values():
        if variable["type"] != "query":
            continue
        assert variable["datasource"]["uid"] == "${datasource}"
        found = re.fullmatch(r"label_values\((\w+)(?:\{[^}]*\})?, (\w+)\)", variable["definition"])
        assert found, variable["definition"]
        metric, label = found.groups()
        assert metric in samples and label in samples[metric], variable["definition"]

    panels = all_panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    rows = [p for p in panels if p["type"] == "row"]
    assert [r["title"].split()[0] for r in rows if r["title"].startswith(("GPU", "Engine", "Tenant"))] == [
        "GPUs",
        "Engines",
        "Tenants",
    ]
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            for used in re.findall(r"\$(\w+)", target["expr"]):
                assert used in variables, f"panel {panel['title']!r} uses undefined ${used}"
    # No two panels overlap on the grid.
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        g = panel["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"panel {panel['title']!r} overlaps another"
        cells |= mine


def test_a_misspelt_metric_or_label_is_caught() -> None:
    samples = exported()
    dashboard = {
        "panels": [
            {"title": "typo", "targets": [{"expr": "inferchain_gpu_memry_used_bytes"}]},
            {"title": "no _total", "targets": [{"expr": "rate(inferchain_proxy_requests[1m])"}]},
            {"title": "label", "targets": [{"expr": 'inferchain_gpu_up{deployment="a"}'}]},
            {"title": "by", "targets": [{"expr": "sum by (tenant) (inferchain_host_up)"}]},
            {"title": "fine", "targets": [{"expr": 'inferchain_gpu_up{host="a"}'}]},
        ]
    }
    problems = query_problems(dashboard, samples)
    assert [p.split("'")[1] for p in problems] == ["typo", "no _total", "label", "by"], problems
