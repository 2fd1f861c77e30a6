"""The offline evaluation a promotion may require, and the quality figures it gives the gates.

One place asks "is this version signed off?", so the rule can change without touching the gate task.
What it checks: an evaluation run (models_registry.evaluation EvalRun) that COMPLETED with no failed
case, whose candidate side ran this version (`candidate_info["model_version_id"]`, recorded when the
run was created against a fleet deployment), and whose current verdict (EvalVerdict not superseded,
signed by an evaluator or admin) is "accept". A later reject supersedes the accept and so withdraws
the sign-off. The newest such run counts.
"""

from __future__ import annotations

from typing import Any

from models_registry.evaluation.models import EvalRun, RunState, VerdictDecision


def accepted_evaluation(version_id: int) -> EvalRun | None:
    """The newest accepted offline evaluation whose candidate is `version_id`, or None."""
    return (
        EvalRun.objects.filter(
            state=RunState.COMPLETED,
            error_count=0,
            candidate_info__model_version_id=version_id,
            verdicts__superseded_at__isnull=True,
            verdicts__decision=VerdictDecision.ACCEPT,
        )
        .order_by("-finished_at", "-id")
        .first()
    )


def has_accepted_evaluation(version_id: int) -> bool:
    return accepted_evaluation(version_id) is not None


def offline_quality(run: EvalRun) -> dict[str, Any]:
    """Flip rate, chrF, exact-match rate and mean KL from a run's summary (None where it has none).

    The KL is the teacher-forced one when the run has it (the same positions on both sides), else the
    free-running top-k figure, labelled by `kl_mode`.
    """
    summary = run.summary or {}
    flips = summary.get("flips") or {}
    distributions = summary.get("distributions") or {}
    mode = "teacher_forced" if "teacher_forced" in distributions else next(iter(sorted(distributions)), None)
    return {
        "evaluation_run": run.pk,
        "samples": summary.get("samples"),
        "flip_rate": flips.get("flip_rate"),
        "chrf": summary.get("chrf"),
        "exact_match_rate": summary.get("exact_match_rate"),
        "kl": distributions[mode]["mean_kl"] if mode else None,
        "kl_mode": mode,
    }
