"""Rollouts' control plane: start, pause, resume, approve, promote and roll back a canary; the gate task's
step; shadow configs.

Every change of a rollout goes through `transition()`: it locks the row, checks the move is allowed from
the state it finds, writes one RolloutDecision with its numbers and one audit event, and tells every
proxy (config pub/sub) once the transaction commits, so the canary's share follows within a second.
Views and the beat task call these functions; none of them touches the proxy's hot path.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Iterable
from typing import Any

import redis
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from core.audit import record_audit
from core.choices import AuditAction
from core.redis_client import get_redis, key, publish_config_change
from models_registry.models import ModelAlias, ModelVersion
from models_registry.services import RegistrationError, switch_alias
from nodes.choices import DeploymentState
from nodes.models import Deployment
from routing.models import (
    ACTIVE_ROLLOUT_STATES,
    Rollout,
    RolloutDecision,
    RolloutState,
    StickyBy,
)
from routing.rollouts.gates import Decision, Verdict, decide, measure
from routing.rollouts.plans import (
    PlanError,
    validate_analysis,
    validate_approval_steps,
    validate_gates,
    validate_percent,
    validate_steps,
)
from routing.rollouts.signoff import has_accepted_evaluation

log = logging.getLogger(__name__)

Action = RolloutDecision.Action
RUNNING, PAUSED, HOLDING = RolloutState.RUNNING, RolloutState.PAUSED, RolloutState.HOLDING
AWAITING = RolloutState.AWAITING_APPROVAL
# The states the gate task evaluates: a paused rollout, or one awaiting approval, waits for a person
# (only a dead candidate is still rolled back, since nothing could serve its share).
EVALUATED_STATES = (RUNNING, HOLDING)


class RolloutStateError(Exception):
    """The action does not apply to the rollout as it is now (e.g. resume a rollout that is not paused)."""


def ready_deployments(alias_name: str, version_id: int) -> int:
    """Ready deployments of `version_id` under the alias's served name: what could take its share."""
    return Deployment.objects.filter(
        model_version_id=version_id, served_model_name=alias_name, state=DeploymentState.READY
    ).count()


def check_candidate(alias: ModelAlias, candidate: ModelVersion, field: str = "candidate_version") -> None:
    """A candidate must differ from the active version and have a ready deployment serving the alias."""
    if candidate.pk == alias.active_version_id:
        raise PlanError(field, f"{candidate} is already the active version of '{alias.name}'.")
    if ready_deployments(alias.name, candidate.pk) == 0:
        raise PlanError(
            field,
            f"{candidate} has no ready deployment serving '{alias.name}'; deploy it with served model "
            f"name '{alias.name}' first.",
        )


def snapshot(rollout: Rollout) -> dict[str, Any]:
    return {
        "alias": rollout.alias.name,
        "baseline_version": rollout.baseline_version_id,
        "candidate_version": rollout.candidate_version_id,
        "steps": rollout.steps,
        "step_index": rollout.step_index,
        "share": rollout.share,
        "state": rollout.state,
        "gates": rollout.gates,
        "require_signoff": rollout.require_signoff,
        "min_step_seconds": rollout.min_step_seconds,
        "min_step_requests": rollout.min_step_requests,
        "analysis": rollout.analysis,
        "approval_steps": rollout.approval_steps,
    }


def _record(
    rollout: Rollout,
    action: str,
    from_share: float,
    *,
    actor: Any,
    reason: str,
    numbers: dict[str, Any] | None,
    audit_action: str = AuditAction.ACTION,
    before: dict[str, Any] | None = None,
) -> RolloutDecision:
    user = actor if getattr(actor, "pk", None) else None
    decision = RolloutDecision.objects.create(
        rollout=rollout,
        action=action,
        from_share=from_share,
        to_share=rollout.share,
        numbers=numbers or {},
        reason=reason,
        actor=user,
    )
    record_audit(
        actor=actor,
        action=audit_action,
        obj=rollout,
        before=before,
        after={**snapshot(rollout), "decision": action, "reason": reason, "numbers": numbers or {}},
    )
    publish_config_change("rollout", alias=rollout.alias.name, id=rollout.pk)
    return decision


def transition(
    rollout: Rollout,
    action: str,
    *,
    allowed_from: Iterable[str],
    to_state: str,
    actor: Any = None,
    reason: str = "",
    numbers: dict[str, Any] | None = None,
    expect_step: int | None = None,
    **fields: Any,
) -> Rollout:
    """The one way a rollout changes: lock, check the state (and step), update, record, audit, publish.

    `expect_step`: the gate task's guard, so a verdict computed for one step is never applied to another
    (a person acted, or another beat tick got there first); it raises RolloutStateError instead.
    """
    with transaction.atomic():
        locked = (
            Rollout.objects.select_for_update(of=("self",))
            .select_related("alias", "candidate_version__model", "baseline_version__model")
            .get(pk=rollout.pk)
        )
        allowed = set(allowed_from)
        if locked.state not in allowed:
            only = " or ".join(sorted(allowed))
            raise RolloutStateError(f"Cannot {action} a rollout that is {locked.state} (only when {only}).")
        if expect_step is not None and locked.step_index != expect_step:
            raise RolloutStateError(f"The rollout moved to step {locked.step_index + 1} meanwhile.")
        before = snapshot(locked)
        from_share = locked.share
        # Every decision names the step it was taken at, so the console shows each step's decisions.
        numbers = {
            **(numbers or {}),
            "step": (numbers or {}).get("step")
            or {"index": locked.step_index, "share": from_share, "steps": locked.steps},
        }
        locked.state = to_state
        locked.reason = reason
        for name, value in fields.items():
            setattr(locked, name, value)
        if to_state not in ACTIVE_ROLLOUT_STATES:
            locked.finished_at = timezone.now()
        locked.save()
        _record(locked, action, from_share, actor=actor, reason=reason, numbers=numbers, before=before)
    return locked


# -- what people do ----------------------------------------------------------------------------------------


def start_rollout(
    alias: ModelAlias,
    candidate: ModelVersion,
    steps: Any,
    *,
    actor: Any,
    gates: Any = None,
    min_step_seconds: int = 300,
    min_step_requests: int = 100,
    require_signoff: bool = False,
    sticky_by: str = StickyBy.SESSION,
    analysis: Any = None,
    approval_steps: Any = None,
) -> Rollout:
    """Start a canary of `candidate` on `alias` at its first step. Raises PlanError naming the bad field."""
    plan = validate_steps(steps)
    thresholds = validate_gates(gates)
    limits = validate_analysis(analysis, thresholds)
    approvals = validate_approval_steps(approval_steps, plan)
    with transaction.atomic():
        locked = ModelAlias.objects.select_for_update().select_related("active_version").get(pk=alias.pk)
        if Rollout.objects.filter(alias=locked, state__in=ACTIVE_ROLLOUT_STATES).exists():
            raise PlanError(
                "alias", f"'{locked.name}' already has an active rollout; finish or roll it back first."
            )
        check_candidate(locked, candidate)
        try:
            with transaction.atomic():
                rollout = Rollout.objects.create(
                    alias=locked,
                    baseline_version=locked.active_version,
                    candidate_version=candidate,
                    steps=plan,
                    step_index=0,
                    share=plan[0],
                    state=RUNNING,
                    sticky_by=sticky_by,
                    min_step_seconds=min_step_seconds,
                    min_step_requests=min_step_requests,
                    gates=thresholds,
                    analysis=limits,
                    approval_steps=approvals,
                    require_signoff=require_signoff,
                    step_started_at=timezone.now(),
                    reason=f"Started at {plan[0]:g}%.",
                    created_by=actor if getattr(actor, "pk", None) else None,
                )
        except IntegrityError:  # a concurrent start won the one-active-rollout constraint
            raise PlanError("alias", f"'{locked.name}' already has an active rollout.") from None
        rollout.alias = locked
        _record(
            rollout,
            Action.START,
            0.0,
            actor=actor,
            reason=rollout.reason,
            numbers={
                "plan": {
                    "steps": plan,
                    "gates": thresholds,
                    "min_step_seconds": min_step_seconds,
                    "min_step_requests": min_step_requests,
                    "require_signoff": require_signoff,
                    "analysis": limits,
                    "approval_steps": approvals,
                }
            },
            audit_action=AuditAction.CREATE,
        )
    return rollout


def pause(rollout: Rollout, *, actor: Any, reason: str = "") -> Rollout:
    return transition(
        rollout,
        Action.PAUSE,
        allowed_from=(RUNNING, HOLDING),
        to_state=PAUSED,
        actor=actor,
        reason=reason or f"Paused at {rollout.share:g}%.",
    )


def resume(rollout: Rollout, *, actor: Any, reason: str = "") -> Rollout:
    """Back to the gate task in the same step (same window); the step's analysis counts start afresh, so
    a rollout the gate task paused for Inconclusive gates is measured again, not paused at once."""
    return transition(
        rollout,
        Action.RESUME,
        allowed_from=(PAUSED, HOLDING),
        to_state=RUNNING,
        actor=actor,
        reason=reason or f"Resumed at {rollout.share:g}%.",
        analysis_state={},
    )


def approve(rollout: Rollout, *, actor: Any, reason: str = "") -> Rollout:
    """An admin's approval of a step awaiting it: on to the next step, or from the last step below 100 the
    promotion (refused as promote is, e.g. a missing sign-off, and then nothing changes)."""
    step = rollout.step_index
    nxt = step + 1
    last = nxt >= len(rollout.steps) - 1
    then = "promoting" if last else f"on to {float(rollout.steps[nxt]):g}%"
    text = reason or f"Approved at {rollout.share:g}%: {then}."
    with transaction.atomic():
        if last:
            approved = transition(
                rollout,
                Action.APPROVE,
                allowed_from=(AWAITING,),
                to_state=RUNNING,
                actor=actor,
                reason=text,
                expect_step=step,
            )
            return promote(
                approved,
                actor=actor,
                reason=f"Promoted after approval: {approved.candidate_version} is the active version.",
            )
        return transition(
            rollout,
            Action.APPROVE,
            allowed_from=(AWAITING,),
            to_state=RUNNING,
            actor=actor,
            reason=text,
            expect_step=step,
            step_index=nxt,
            share=float(rollout.steps[nxt]),
            step_started_at=timezone.now(),
            analysis_state={},
        )


def rollback(
    rollout: Rollout,
    *,
    actor: Any,
    reason: str = "",
    numbers: dict[str, Any] | None = None,
    expect_step: int | None = None,
) -> Rollout:
    """Share to 0 at once; the candidate keeps its deployments (stopping them is a separate choice)."""
    return transition(
        rollout,
        Action.ROLLBACK,
        allowed_from=ACTIVE_ROLLOUT_STATES,
        to_state=RolloutState.ROLLED_BACK,
        actor=actor,
        reason=reason or f"Rolled back from {rollout.share:g}%.",
        numbers=numbers,
        expect_step=expect_step,
        share=0.0,
    )


def promote(
    rollout: Rollout,
    *,
    actor: Any,
    reason: str = "",
    numbers: dict[str, Any] | None = None,
    expect_step: int | None = None,
) -> Rollout:
    """Make the candidate the alias's active version (audited, published) and finish the rollout at 100%.

    Refused when the plan requires a sign-off and no accepted offline evaluation of the candidate exists,
    or when the candidate has no ready deployment (the alias would answer 503 on every request).
    """
    if rollout.require_signoff and not has_accepted_evaluation(rollout.candidate_version_id):
        raise PlanError(
            "require_signoff",
            f"The plan requires a signed-off offline evaluation of {rollout.candidate_version}; "
            "none is accepted.",
        )
    if ready_deployments(rollout.alias.name, rollout.candidate_version_id) == 0:
        raise PlanError(
            "candidate_version",
            f"{rollout.candidate_version} has no ready deployment serving '{rollout.alias.name}'.",
        )
    with transaction.atomic():
        promoted = transition(
            rollout,
            Action.PROMOTE,
            allowed_from=ACTIVE_ROLLOUT_STATES,
            to_state=RolloutState.PROMOTED,
            actor=actor,
            reason=reason or f"Promoted: {rollout.candidate_version} is the active version.",
            numbers=numbers,
            expect_step=expect_step,
            share=100.0,
            step_index=len(rollout.steps) - 1,
        )
        try:
            switch_alias(promoted.alias, promoted.candidate_version, actor=actor)
        except RegistrationError as exc:
            raise PlanError("candidate_version", str(exc)) from None
    return promoted


# -- the gate task ----------------------------------------------------------------------------------------


def _gate_samples_key(rollout_id: int) -> str:
    return key("rollout", str(rollout_id), "gates")


def push_gate_sample(rollout: Rollout, decision: Decision) -> None:
    """Keep this evaluation's gate values for the console's chart (a capped list in Redis)."""
    sample = {
        "t": decision.figures.until.isoformat(),
        "step": rollout.step_index,
        "share": rollout.share,
        "verdict": decision.verdict,
        "values": {k: g.value for k, g in decision.gates.items()},
        # Statistical gates: the judgement in words (outcome, shift, interval, tolerance, p, sample sizes).
        "details": {k: g.detail for k, g in decision.gates.items() if g.outcome},
        "candidate_requests": decision.figures.candidate.requests,
        "baseline_requests": decision.figures.baseline.requests,
    }
    name = _gate_samples_key(rollout.pk)
    try:
        with get_redis().pipeline(transaction=False) as pipe:
            pipe.rpush(name, json.dumps(sample))
            pipe.ltrim(name, -settings.ROLLOUT_GATE_SAMPLES, -1)
            pipe.expire(name, int(settings.ROLLOUT_GATE_SAMPLES_TTL_SECONDS))
            pipe.execute()
    except redis.RedisError:
        log.warning("rollout %s: gate sample not kept (Redis)", rollout.pk)


def gate_samples(rollout_id: int) -> list[dict[str, Any]]:
    try:
        raw = get_redis().lrange(_gate_samples_key(rollout_id), 0, -1)
    except redis.RedisError:
        return []
    return [json.loads(item) for item in raw]


def evaluate(rollout: Rollout, now: dt.datetime | None = None) -> tuple[str, Rollout]:
    """One gate-task step for one rollout: measure, decide, apply. Returns (verdict, rollout)."""
    now = now or timezone.now()
    ready = ready_deployments(rollout.alias.name, rollout.candidate_version_id)
    if rollout.state in (PAUSED, AWAITING) and ready:
        return Verdict.KEEP, rollout  # waits for its person unless its candidate died
    figures = measure(rollout, now, ready)
    decision = decide(rollout, figures)
    push_gate_sample(rollout, decision)
    numbers = decision.numbers(rollout)
    step = rollout.step_index
    # The step's counts after this measurement, kept whatever the verdict (most ticks record nothing).
    Rollout.objects.filter(pk=rollout.pk, step_index=step, state__in=EVALUATED_STATES).update(
        analysis_state=decision.analysis_state
    )
    rollout.analysis_state = decision.analysis_state
    try:
        if decision.verdict == Verdict.ROLLBACK:
            return decision.verdict, rollback(
                rollout, actor=None, reason=decision.reason, numbers=numbers, expect_step=step
            )
        if decision.verdict == Verdict.ADVANCE:
            nxt = step + 1
            return decision.verdict, transition(
                rollout,
                Action.ADVANCE,
                allowed_from=EVALUATED_STATES,
                to_state=RUNNING,
                reason=decision.reason,
                numbers=numbers,
                expect_step=step,
                step_index=nxt,
                share=float(rollout.steps[nxt]),
                step_started_at=now,
                analysis_state={},
            )
        if decision.verdict == Verdict.AWAIT_APPROVAL:
            return decision.verdict, transition(
                rollout,
                Action.AWAIT_APPROVAL,
                allowed_from=EVALUATED_STATES,
                to_state=AWAITING,
                reason=decision.reason,
                numbers=numbers,
                expect_step=step,
            )
        if decision.verdict == Verdict.PAUSE:
            return decision.verdict, transition(
                rollout,
                Action.PAUSE,
                allowed_from=EVALUATED_STATES,
                to_state=PAUSED,
                reason=decision.reason,
                numbers=numbers,
                expect_step=step,
            )
        if decision.verdict == Verdict.PROMOTE:
            try:
                return decision.verdict, promote(
                    rollout, actor=None, reason=decision.reason, numbers=numbers, expect_step=step
                )
            except PlanError as exc:
                # Gates passed but the promotion is not allowed yet (sign-off missing): a person decides.
                return _hold(rollout, f"Gates passed; promotion waits: {exc.message}", numbers, step)
        if decision.verdict == Verdict.HOLD:
            return _hold(rollout, decision.reason, numbers, step)
    except RolloutStateError as exc:
        log.info("rollout %s: %s verdict dropped (%s)", rollout.pk, decision.verdict, exc)
        return Verdict.KEEP, rollout
    return decision.verdict, rollout


def _hold(rollout: Rollout, reason: str, numbers: dict[str, Any], step: int) -> tuple[str, Rollout]:
    """Enter HOLDING, recorded once per cause: further ticks that hold for the same cause (the text before
    the first colon: "Not enough data", "Gates passed; promotion waits") add no history entry."""
    if rollout.state == HOLDING and rollout.reason.split(":")[0] == reason.split(":")[0]:
        return Verdict.HOLD, rollout
    return Verdict.HOLD, transition(
        rollout,
        Action.HOLD,
        allowed_from=(RUNNING, HOLDING),
        to_state=HOLDING,
        reason=reason,
        numbers=numbers,
        expect_step=step,
    )


def evaluate_all(now: dt.datetime | None = None) -> dict[int, str]:
    """The beat task's body: every active rollout once (running, holding, paused, awaiting approval);
    returns verdicts by id."""
    out: dict[int, str] = {}
    rollouts = Rollout.objects.filter(state__in=ACTIVE_ROLLOUT_STATES).select_related(
        "alias", "candidate_version__model", "baseline_version__model"
    )
    for rollout in rollouts:
        try:
            out[rollout.pk], _ = evaluate(rollout, now)
        except Exception:  # one broken rollout must not stop the others' gates
            log.exception("rollout %s: evaluation failed", rollout.pk)
            out[rollout.pk] = "error"
    return out


# -- shadow configs -----------------------------------------------------------------------------------------


def check_shadow(alias: ModelAlias, candidate: ModelVersion, percent: Any) -> float:
    """A shadow config's rules: a percentage 0..100, and a candidate other than the active version that has
    a ready deployment serving the alias. Returns the percentage."""
    value = validate_percent(percent)
    check_candidate(alias, candidate)
    return value
