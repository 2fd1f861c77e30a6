"""The offline evaluation a promotion may require, and the quality figures it gives the gates.

One place asks "is this version signed off?", so the rule can change without touching the gate task.
What it checks today: an evaluation run (models_registry.evaluation EvalRun) that COMPLETED with no
failed case, whose candidate side ran this version (`candidate_info["model_version_id"]`, recorded
when the run was created against a fleet deployment), and, where the run model has a verdict (the
evaluator's sign-off), a verdict of "accept". The newest such run counts.
"""

from __future__ import annotations

from typing import Any

from models_registry.evaluation.models import EvalRun, RunState

# The sign-off fields, where EvalRun has them (issue 11's verdict); absent fields are not checked.
VERDICT_FIELD = "verdict"
ACCEPTED = "accept"


def _has_field(name: str) -> bool:
    return any(f.name == name for f in EvalRun._meta.get_fields())


def accepted_evaluation(version_id: int) -> EvalRun | None:
    """The newest accepted offline evaluation whose candidate is `version_id`, or None."""
    runs = EvalRun.objects.filter(
        state=RunState.COMPLETED, error_count=0, candidate_info__model_version_id=version_id
    )
    if _has_field(VERDICT_FIELD):
        runs = runs.filter(**{VERDICT_FIELD: ACCEPTED})
    return runs.order_by("-finished_at", "-id").first()


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
