"""Performance baselines: a bench run (`inferchain bench`, docs/bench.md) read into a deployment's
record of its normal speed, and the live engine compared against it.

The comparison is the production checklist's "recorded baseline to compare against later": at the load
the engine carries now (requests running), what TTFT p95 did the baseline see, and is the live one far
above it? Only closed-loop runs (N clients) map onto a live load; open-loop runs are kept and drawn.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

# Live TTFT p95 over this many times the baseline's at the same load is called out.
OUTSIDE_FACTOR = 2.0

LEVEL_FIELDS = (
    "requests_per_s",
    "output_tokens_per_s",
    "goodput_requests_per_s",
    "ttft_p50_s",
    "ttft_p95_s",
    "ttft_p99_s",
    "itl_p50_s",
    "itl_p95_s",
    "latency_p50_s",
    "latency_p95_s",
    "latency_p99_s",
)


class BaselineError(ValueError):
    """A bench report that cannot be a baseline; `errors` maps a field to what was wrong."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__("; ".join(f"{k}: {' '.join(v)}" for k, v in errors.items()))
        self.errors = errors


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _level(raw: Any, i: int) -> dict[str, Any]:
    where = f"levels[{i}]"
    if not isinstance(raw, dict):
        raise BaselineError({"report": [f"{where} is not an object."]})
    clients, rate = raw.get("clients"), raw.get("rate")
    if (clients is None) == (rate is None):
        raise BaselineError({"report": [f"{where} must have either 'clients' or 'rate'."]})
    row: dict[str, Any] = {"clients": clients, "rate": rate}
    if clients is not None and (not isinstance(clients, int) or isinstance(clients, bool) or clients < 1):
        raise BaselineError({"report": [f"{where}.clients must be a positive integer."]})
    if rate is not None and ((_number(rate) or 0) <= 0):
        raise BaselineError({"report": [f"{where}.rate must be a positive number."]})
    for name in ("requests_per_s", "output_tokens_per_s", "goodput_requests_per_s"):
        value = _number(raw.get(name))
        if value is None or value < 0:
            raise BaselineError({"report": [f"{where}.{name} must be a number of 0 or more."]})
        row[name] = value
    for metric in ("ttft", "itl", "latency"):
        dist = raw.get(f"{metric}_s")
        if not isinstance(dist, dict):
            raise BaselineError({"report": [f"{where}.{metric}_s must be an object of percentiles."]})
        for q in ("p50", "p95", "p99"):
            if f"{metric}_{q}_s" in LEVEL_FIELDS:
                row[f"{metric}_{q}_s"] = _number(dist.get(q))
    errors = raw.get("errors") or {}
    row["error_count"] = sum(int(v) for v in errors.values()) if isinstance(errors, dict) else 0
    row["ok"] = int(raw.get("ok") or 0)
    return row


def parse_report(report: Any) -> dict[str, Any]:
    """The fields of a PerformanceBaseline from a bench report (the JSON `inferchain bench` writes)."""
    if not isinstance(report, dict):
        raise BaselineError({"report": ["Expected the JSON object `inferchain bench --out` writes."]})
    raw_levels = report.get("levels")
    if not isinstance(raw_levels, list) or not raw_levels:
        raise BaselineError({"report": ["The report has no load levels ('levels' is missing or empty)."]})
    levels = [_level(raw, i) for i, raw in enumerate(raw_levels)]
    modes = {"closed" if lv["clients"] is not None else "open" for lv in levels}
    if len(modes) > 1:
        raise BaselineError({"report": ["The levels mix clients and rates; save one kind of sweep."]})
    raw_slo = report.get("slo")
    slo: dict[str, Any] = raw_slo if isinstance(raw_slo, dict) else {}
    knee = report.get("knee_index")
    if knee is not None and (not isinstance(knee, int) or not 0 <= knee < len(levels)):
        knee = None
    key = "clients" if "closed" in modes else "rate"
    return {
        "target": str(report.get("target") or "")[:300],
        "model": str(report.get("model") or "")[:200],
        "mode": modes.pop(),
        "slo_ttft_s": _number(slo.get("ttft_s")) or 0.5,
        "slo_itl_s": _number(slo.get("itl_s")) or 0.05,
        "knee_index": knee,
        "levels": sorted(levels, key=lambda lv: lv[key]),
    }


def expected_at(levels: list[dict[str, Any]], load: float, field: str) -> float | None:
    """The baseline's `field` at `load` clients, by linear interpolation between its levels (held flat
    beyond the first and last level)."""
    points = [(float(lv["clients"]), lv[field]) for lv in levels if lv.get(field) is not None]
    if not points:
        return None
    if load <= points[0][0]:
        return float(points[0][1])
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if load <= x1:
            return float(y0 + (y1 - y0) * (load - x0) / (x1 - x0))
    return float(points[-1][1])


def compare(baseline: Any, live: dict[str, Any] | None) -> dict[str, Any]:
    """Live TTFT p95 at the current load against the baseline's at the same load."""
    out: dict[str, Any] = {
        "baseline_id": baseline.pk if baseline is not None else None,
        "load": None,
        "live_ttft_p95_s": None,
        "expected_ttft_p95_s": None,
        "ratio": None,
        "status": "unknown",
        "message": "",
    }
    if baseline is None:
        out["message"] = "No baseline yet: save an `inferchain bench` run of this deployment."
        return out
    if baseline.mode != "closed":
        out["message"] = "This baseline is an open-loop run (requests/s); comparing needs a run by clients."
        return out
    if not live or live.get("ttft_p95_s") is None:
        out["message"] = "No live TTFT from the engine right now (not running, or no requests lately)."
        return out
    load = float(live.get("num_requests_running") or 0) + float(live.get("num_requests_waiting") or 0)
    load = max(load, 1.0)
    expected = expected_at(baseline.levels, load, "ttft_p95_s")
    out["load"] = load
    out["live_ttft_p95_s"] = float(live["ttft_p95_s"])
    if expected is None or expected <= 0:
        out["message"] = "The baseline has no TTFT p95 to compare with."
        return out
    ratio = out["live_ttft_p95_s"] / expected
    out.update(expected_ttft_p95_s=expected, ratio=ratio)
    top = max(lv["clients"] for lv in baseline.levels)
    beyond = f" (beyond the baseline's highest load, {top} clients)" if load > top else ""
    if ratio > OUTSIDE_FACTOR:
        out["status"] = "outside"
        out["message"] = (
            f"TTFT p95 is {ratio:.1f}x the baseline at {load:g} requests in flight{beyond}: "
            f"{out['live_ttft_p95_s'] * 1000:.0f} ms live against {expected * 1000:.0f} ms "
            f"in '{baseline.name}'."
        )
    else:
        out["status"] = "within"
        out["message"] = (
            f"Within the baseline: TTFT p95 {out['live_ttft_p95_s'] * 1000:.0f} ms live against "
            f"{expected * 1000:.0f} ms at {load:g} requests in flight{beyond}."
        )
    return out
