"""A rollout's decision history as plain text (manage.py rollout_history, the closing note of a canary)."""

from __future__ import annotations

from typing import Any

from routing.models import Rollout


def _pct(value: Any) -> str:
    return "-" if value is None else f"{value:.2%}"


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def _share(value: float) -> str:
    return f"{value:g}%"


def _side(numbers: dict[str, Any], name: str) -> str:
    side = numbers.get(name) or {}
    if not side:
        return ""
    return (
        f"{name} {side.get('requests', 0)} req, {_pct(side.get('error_rate'))} err, "
        f"p95 {_ms(side.get('p95_latency_ms'))}, TTFT p95 {_ms(side.get('p95_ttft_ms'))}"
    )


def format_history(rollout: Rollout) -> str:
    """One header, then one block per decision: when, what, share before and after, who, why, the numbers."""
    lines = [
        f"Rollout {rollout.pk}: {rollout.alias.name}  "
        f"{rollout.baseline_version} -> {rollout.candidate_version}",
        f"  plan {' -> '.join(f'{s:g}%' for s in rollout.steps)}; at least {rollout.min_step_seconds} s and "
        f"{rollout.min_step_requests} candidate requests per step; sign-off "
        f"{'required' if rollout.require_signoff else 'not required'}",
        "  gates " + (", ".join(f"{k} {v:g}" for k, v in rollout.gates.items()) or "none"),
        *(
            ["  approval after " + ", ".join(f"{s:g}%" for s in rollout.approval_steps)]
            if rollout.approval_steps
            else []
        ),
        *([f"  analysis {rollout.analysis}"] if rollout.analysis else []),
        f"  now {rollout.state} at {rollout.share:g}%",
        "",
    ]
    for d in rollout.decisions.select_related("actor").order_by("created_at", "id"):
        who = d.actor.get_username() if d.actor else "gate task"
        lines.append(
            f"{d.created_at:%Y-%m-%d %H:%M:%S}  {d.action.upper():<8} "
            f"{_share(d.from_share):>5} -> {_share(d.to_share):<5}  by {who}"
        )
        lines.append(f"    {d.reason}")
        numbers = d.numbers or {}
        window = numbers.get("window") or {}
        if window:
            lines.append(f"    window {window.get('seconds', 0):.0f} s")
            lines.extend(f"    {_side(numbers, side)}" for side in ("candidate", "baseline"))
        for key, gate in (numbers.get("gates") or {}).items():
            verdict = {True: "pass", False: "FAIL", None: "no data"}[gate.get("passed")]
            value = gate.get("value")
            shown = "-" if value is None else f"{value:.4g}"
            extra = ""
            if gate.get("outcome") in ("Error", "Inconclusive") or gate.get("dry_run"):
                extra = f" ({gate.get('outcome')}{', dry run' if gate.get('dry_run') else ''})"
            lines.append(f"    gate {key}: {shown} vs {gate.get('threshold'):g} -> {verdict}{extra}")
    return "\n".join(lines) + "\n"
