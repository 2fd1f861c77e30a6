"""Reviewing a run: a mark on each sample, the run's signed verdict, and its samples as CSV or JSONL.

A reviewer (evaluator or admin) marks samples `same`, `acceptable` or `regression` with an optional
comment; marking a sample again replaces its mark (one per sample). The run then gets a verdict,
`accept` or `reject`, signed by whoever gives it. Verdicts are never edited: a new one supersedes the
current one, which stays in the history. Both are written to the audit log. docs/evaluations.md,
"Review and sign-off", says the same for users.

Views call these functions; they hold the rules (what may be signed when) and the audit records.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from core.audit import record_audit
from core.choices import AuditAction
from core.live import push_live_event
from models_registry.evaluation.models import (
    EvalReview,
    EvalRun,
    EvalSample,
    EvalVerdict,
    RunState,
    SampleMark,
    VerdictDecision,
)
from models_registry.evaluation.runner import run_group
from models_registry.models import ModelVersion

log = logging.getLogger(__name__)

Actor = AbstractBaseUser | AnonymousUser | None


class ReviewRefused(Exception):
    """A mark or a verdict that the run's or sample's state does not allow (the API answers 409)."""


def _user(actor: Actor) -> tuple[Any, str]:
    """The user row to store (None for the system) and the name kept beside it."""
    if isinstance(actor, AbstractBaseUser) and actor.pk:
        return actor, actor.get_username()
    return None, "system"


# -- marks ------------------------------------------------------------------------------------------------


def _mark_snapshot(review: EvalReview | None) -> dict[str, Any] | None:
    if review is None:
        return None
    return {"mark": review.mark, "comment": review.comment, "marked_by": review.marked_by_name}


def mark_sample(sample: EvalSample, mark: str, comment: str = "", *, actor: Actor) -> EvalReview:
    """Mark one sample (replacing any earlier mark), audited. A sample whose requests failed has no
    outputs to judge and is refused."""
    if mark not in SampleMark.values:
        raise ValueError(f"unknown mark {mark!r}")
    if sample.error:
        raise ReviewRefused(
            "This sample has no outputs (its requests failed); resume the run to run it again."
        )
    user, name = _user(actor)
    with transaction.atomic():
        # Lock the sample row: two reviewers marking it at once end with one mark, the later one.
        EvalSample.objects.select_for_update().filter(pk=sample.pk).first()
        before = EvalReview.objects.filter(sample=sample).first()
        snapshot = _mark_snapshot(before)
        review, _ = EvalReview.objects.update_or_create(
            sample=sample,
            defaults={
                "mark": mark,
                "comment": comment,
                "marked_by": user,
                "marked_by_name": name,
                "marked_at": timezone.now(),
            },
        )
        record_audit(
            actor=actor,
            action=AuditAction.UPDATE if before is not None else AuditAction.CREATE,
            obj=sample,
            before=snapshot,
            after={"run": sample.run_id, "case": sample.case_key, **(_mark_snapshot(review) or {})},
            object_type="models_registry.evalsample",
        )
    return review


def clear_mark(sample: EvalSample, *, actor: Actor) -> bool:
    """Remove a sample's mark (audited); False when it had none."""
    with transaction.atomic():
        review = EvalReview.objects.select_for_update().filter(sample=sample).first()
        if review is None:
            return False
        record_audit(
            actor=actor,
            action=AuditAction.DELETE,
            obj=sample,
            before={"run": sample.run_id, "case": sample.case_key, **(_mark_snapshot(review) or {})},
        )
        review.delete()
    return True


def mark_counts(run: EvalRun) -> dict[str, int]:
    """How many of the run's scored samples carry each mark, and how many none.

    Uses the counts EvalRunViewSet's queryset annotates (one query for a whole list) when present.
    """
    names = {m.value: f"mark_{m.value}" for m in SampleMark}
    if all(hasattr(run, attr) for attr in (*names.values(), "reviewable_count")):
        counts = {mark: int(getattr(run, attr)) for mark, attr in names.items()}
        reviewable = int(getattr(run, "reviewable_count"))  # noqa: B009 (an annotation mypy cannot see)
    else:
        counts = dict.fromkeys(names, 0)
        for mark, n in EvalReview.objects.filter(sample__run=run).values_list("mark").annotate(n=Count("id")):
            counts[mark] = n
        reviewable = run.samples.filter(error="").count()
    counts["unmarked"] = max(0, reviewable - sum(counts[m] for m in names))
    return counts


def mark_count_annotations() -> dict[str, Any]:
    """Annotations for an EvalRun queryset that mark_counts() reads instead of querying per run."""
    out: dict[str, Any] = {
        f"mark_{m.value}": Count("samples__review", filter=Q(samples__review__mark=m.value))
        for m in SampleMark
    }
    out["reviewable_count"] = Count("samples", filter=Q(samples__error=""))
    return out


# -- verdicts ---------------------------------------------------------------------------------------------


def current_verdict(run: EvalRun) -> EvalVerdict | None:
    """The run's verdict in force (the prefetched `current_verdicts` when the queryset has them)."""
    prefetched = getattr(run, "current_verdicts", None)
    if prefetched is not None:
        return prefetched[0] if prefetched else None
    return run.verdicts.filter(superseded_at__isnull=True).select_related("candidate_version__model").first()


def _candidate_version_id(run: EvalRun) -> int | None:
    """The model version the candidate served, from the run's snapshot (None for a base-URL side)."""
    raw = (run.candidate_info or {}).get("model_version_id")
    if not isinstance(raw, int):
        return None
    return ModelVersion.objects.filter(pk=raw).values_list("pk", flat=True).first()


def sign_run(run: EvalRun, decision: str, comment: str = "", *, actor: Actor) -> EvalVerdict:
    """Sign the run's verdict: it supersedes the current one (kept in the history), audited.

    Only a finished run is signed; only a completed one (every case has a sample) can be accepted, while
    a failed or cancelled run may still be rejected.
    """
    if decision not in VerdictDecision.values:
        raise ValueError(f"unknown decision {decision!r}")
    user, name = _user(actor)
    with transaction.atomic():
        locked = EvalRun.objects.select_for_update().get(pk=run.pk)
        if not locked.finished:
            raise ReviewRefused(f"The run is {locked.state}; sign it off once it has finished.")
        if decision == VerdictDecision.ACCEPT and locked.state != RunState.COMPLETED:
            raise ReviewRefused(
                f"Only a completed run can be accepted; this one is {locked.state}. "
                "Resume it first, or reject it."
            )
        if decision == VerdictDecision.ACCEPT:
            scored = locked.samples.filter(error="").count()
            needed = settings.EVAL_MIN_SCORED_SAMPLES
            if scored < needed:
                # Too few paired samples say nothing about a difference either way (docs/evaluations.md).
                raise ReviewRefused(
                    f"The run scored {scored} sample(s); accepting needs at least {needed} "
                    "(EVAL_MIN_SCORED_SAMPLES). Run a larger suite, or reject it."
                )
        previous = locked.verdicts.filter(superseded_at__isnull=True).first()
        now = timezone.now()
        if previous is not None:
            EvalVerdict.objects.filter(pk=previous.pk).update(superseded_at=now)
        verdict = EvalVerdict.objects.create(
            run=locked,
            decision=decision,
            comment=comment,
            candidate_version_id=_candidate_version_id(locked),
            signed_by=user,
            signed_by_name=name,
            signed_at=now,
        )
        record_audit(
            actor=actor,
            action=AuditAction.ACTION,
            obj=locked,
            before=(
                {"verdict": previous.decision, "verdict_id": previous.pk, "comment": previous.comment}
                if previous is not None
                else None
            ),
            after={
                "verdict": decision,
                "verdict_id": verdict.pk,
                "comment": comment,
                "candidate_version": verdict.candidate_version_id,
                "marks": mark_counts(locked),
            },
        )
        transaction.on_commit(lambda: _push_verdict(verdict))
    return verdict


def _push_verdict(verdict: EvalVerdict) -> None:
    try:
        push_live_event(
            run_group(verdict.run_id),
            {"type": "eval_run.verdict", "run": verdict.run_id, "decision": verdict.decision},
        )
    except Exception:  # a live push never undoes a signature (Redis down: the page reloads it)
        log.warning("eval run %s: live verdict push failed", verdict.run_id, exc_info=True)


# -- export -----------------------------------------------------------------------------------------------

# One row per sample, in this column order (CSV header; JSONL keys, which add the JSONL_EXTRA ones).
EXPORT_COLUMNS = (
    "run",
    "sample",
    "case_id",
    "position",
    "tags",
    "prompt",
    "expected",
    "match_rule",
    "reference_output",
    "candidate_output",
    "exact_match",
    "first_divergence",
    "token_agreement",
    "chrf",
    "reference_token_count",
    "candidate_token_count",
    "length_difference",
    "reference_correct",
    "candidate_correct",
    "flip",
    "kl_mode",
    "kl_positions",
    "mean_kl",
    "max_kl",
    "top1_agreement",
    "reference_latency_ms",
    "candidate_latency_ms",
    "reference_ttft_ms",
    "candidate_ttft_ms",
    "reference_tokens_per_s",
    "candidate_tokens_per_s",
    "error",
    "mark",
    "mark_comment",
    "marked_by",
    "marked_at",
)
# Only in JSONL: the token lists and per-position values (too long for a spreadsheet cell), the chat
# messages of message-list cases, and score_sample's whole dict.
JSONL_EXTRA = (
    "messages",
    "reference_tokens",
    "candidate_tokens",
    "reference_token_logprobs",
    "candidate_token_logprobs",
    "position_kl",
    "scores",
)


def export_rows(samples: Iterable[EvalSample]) -> Iterator[dict[str, Any]]:
    """Each sample as a flat dict of EXPORT_COLUMNS + JSONL_EXTRA (give samples with case and review
    selected)."""
    for s in samples:
        scores = s.scores or {}
        review = review_of(s)
        case = s.case
        yield {
            "run": s.run_id,
            "sample": s.pk,
            "case_id": s.case_key,
            "position": s.position,
            "tags": list(s.tags or []),
            "prompt": case.prompt,
            "expected": case.expected,
            "match_rule": case.match_rule or None,
            "reference_output": s.reference_output,
            "candidate_output": s.candidate_output,
            "exact_match": s.exact_match,
            "first_divergence": s.first_divergence,
            "token_agreement": s.token_agreement,
            "chrf": s.chrf,
            "reference_token_count": scores.get("reference_tokens"),
            "candidate_token_count": scores.get("candidate_tokens"),
            "length_difference": scores.get("length_difference"),
            "reference_correct": s.reference_correct,
            "candidate_correct": s.candidate_correct,
            "flip": s.flip or None,
            "kl_mode": s.kl_mode or None,
            "kl_positions": scores.get("kl_positions"),
            "mean_kl": s.mean_kl,
            "max_kl": s.max_kl,
            "top1_agreement": s.top1_agreement,
            "reference_latency_ms": s.reference_latency_ms,
            "candidate_latency_ms": s.candidate_latency_ms,
            "reference_ttft_ms": s.reference_ttft_ms,
            "candidate_ttft_ms": s.candidate_ttft_ms,
            "reference_tokens_per_s": s.reference_tokens_per_s,
            "candidate_tokens_per_s": s.candidate_tokens_per_s,
            "error": s.error,
            "mark": review.mark if review else None,
            "mark_comment": review.comment if review else None,
            "marked_by": review.marked_by_name if review else None,
            "marked_at": review.marked_at.isoformat() if review else None,
            "messages": case.messages,
            "reference_tokens": s.reference_tokens,
            "candidate_tokens": s.candidate_tokens,
            "reference_token_logprobs": s.reference_token_logprobs,
            "candidate_token_logprobs": s.candidate_token_logprobs,
            "position_kl": s.position_kl,
            "scores": scores,
        }


def review_of(sample: EvalSample) -> EvalReview | None:
    """The sample's mark, or None (the reverse one-to-one raises when there is none)."""
    try:
        return sample.review
    except EvalReview.DoesNotExist:
        return None


def _csv_cell(value: Any) -> Any:
    """true/false for booleans, empty for null, JSON for lists; numbers and text as they are."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | dict):
        return json.dumps(value, ensure_ascii=False)
    return value


class _Line:
    """A file-like object whose write() returns what it was given (csv.writer -> one string per row)."""

    def write(self, value: str) -> str:
        return value


def csv_lines(rows: Iterable[dict[str, Any]]) -> Iterator[str]:
    """The header, then one CSV line per row (EXPORT_COLUMNS only), for a streamed download."""
    writer = csv.writer(_Line())
    yield writer.writerow(EXPORT_COLUMNS)
    for row in rows:
        yield writer.writerow([_csv_cell(row[name]) for name in EXPORT_COLUMNS])


def jsonl_lines(rows: Iterable[dict[str, Any]]) -> Iterator[str]:
    """One JSON object per line, every column plus the JSONL_EXTRA ones."""
    for row in rows:
        yield json.dumps(row, ensure_ascii=False) + "\n"
