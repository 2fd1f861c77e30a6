"""Reviewing shadow pairs: a mark per pair, as on an offline run's samples (docs/rollouts.md).

A reviewer (evaluator or admin) marks a mirrored pair `same`, `acceptable` or `regression`, with an
optional comment, the primary's answer standing where an offline run has its reference. Marking it again
replaces the mark; clearing removes it. Both are written to the audit log. Unlike an offline sample, a
pair whose candidate failed can be marked: the primary did answer, and a candidate that fails where the
primary did not is what a reviewer may want to call a regression.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.db import transaction
from django.utils import timezone

from core.audit import record_audit
from core.choices import AuditAction
from models_registry.evaluation.models import SampleMark
from routing.models import ShadowPair

Actor = AbstractBaseUser | AnonymousUser | None


def _snapshot(pair: ShadowPair) -> dict[str, Any] | None:
    if not pair.mark:
        return None
    return {"mark": pair.mark, "comment": pair.comment, "marked_by": pair.marked_by_name}


def _context(pair: ShadowPair) -> dict[str, Any]:
    # What the audit entry is about, without the prompt or the outputs (tenant data stays in the pair).
    return {
        "alias": pair.alias,
        "request_id": pair.request_id,
        "candidate_version": pair.candidate_version_id,
    }


def mark_pair(pair: ShadowPair, mark: str, comment: str = "", *, actor: Actor) -> ShadowPair:
    """Mark one pair (replacing any earlier mark), audited; answers the updated pair."""
    if mark not in SampleMark.values:
        raise ValueError(f"unknown mark {mark!r}")
    user = actor if isinstance(actor, AbstractBaseUser) and actor.pk else None
    with transaction.atomic():
        # Lock the row: two reviewers marking it at once end with one mark, the later one, audited twice.
        locked = ShadowPair.objects.select_for_update().get(pk=pair.pk)
        before = _snapshot(locked)
        locked.mark = mark
        locked.comment = comment
        locked.marked_by_id = user.pk if user else None
        locked.marked_by_name = user.get_username() if user else "system"
        locked.marked_at = timezone.now()
        locked.save(update_fields=["mark", "comment", "marked_by", "marked_by_name", "marked_at"])
        record_audit(
            actor=actor,
            action=AuditAction.UPDATE if before is not None else AuditAction.CREATE,
            obj=locked,
            before=before,
            after={**_context(locked), **(_snapshot(locked) or {})},
        )
    return locked


def clear_pair_mark(pair: ShadowPair, *, actor: Actor) -> bool:
    """Remove a pair's mark (audited); False when it had none."""
    with transaction.atomic():
        locked = ShadowPair.objects.select_for_update().get(pk=pair.pk)
        before = _snapshot(locked)
        if before is None:
            return False
        record_audit(
            actor=actor, action=AuditAction.DELETE, obj=locked, before={**_context(locked), **before}
        )
        locked.mark = ""
        locked.comment = ""
        locked.marked_by_id = None
        locked.marked_by_name = ""
        locked.marked_at = None
        locked.save(update_fields=["mark", "comment", "marked_by", "marked_by_name", "marked_at"])
    return True
