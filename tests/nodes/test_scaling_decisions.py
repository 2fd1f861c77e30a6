"""The scaler on fabricated live state: scale up on load, down with a drain when idle, cooldowns,
one decision per interval, a host lost during a scale-up, and no flapping under an oscillating load."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from core.models import AuditEvent
from nodes.choices import DeploymentState, DesiredState
from nodes.models import Deployment, Host
from routing.scaling import autoscaler
from routing.scaling.models import ScalingDecision
from tests.nodes.conftest import make_host
from tests.nodes.scaling_helpers import ROLE, at, make_policy, set_live, settle, wanted_running

pytestmark = pytest.mark.django_db

UP, DOWN = ScalingDecision.Action.SCALE_UP, ScalingDecision.Action.SCALE_DOWN


@pytest.fixture
def template(host: Host, make_deployment: Any, node_settings: Any, redis_clean: None) -> Deployment:
    # Hosts stay reachable through the test however slow the machine (the lost-host test ages one).
    node_settings.NODE_UNREACHABLE_SECONDS = 3600
    Host.objects.filter(pk=host.pk).update(role=ROLE)
    return make_deployment(role=ROLE, state=DeploymentState.READY)


@pytest.fixture
def second_host(node_settings: Any) -> Host:
    host = make_host("node-b", gpus=2)
    Host.objects.filter(pk=host.pk).update(role=ROLE)
    return host


def test_queue_growth_adds_a_copy_of_the_template_on_the_least_loaded_host(
    template: Deployment, second_host: Host
) -> None:
    policy = make_policy(template)
    set_live(template, waiting=10, running=16, kv=0.5)

    decision = autoscaler.evaluate(policy.pk, now=at(0))

    assert decision is not None and decision.action == UP
    assert (decision.engines_before, decision.engines_after) == (1, 2)
    assert decision.metrics["waiting_per_engine"] == 10.0
    assert "10.0 waiting per engine > 2" in decision.reason
    added = Deployment.objects.get(pk=decision.metrics["added_ids"][0])
    # node-b holds nothing yet: it is the least loaded host of the role.
    assert added.host == second_host and added.gpu_indices == [0] and added.role == ROLE
    for name in autoscaler.TEMPLATE_FIELDS:
        assert getattr(added, name) == getattr(template, name), name
    assert added.state == DeploymentState.PENDING and added.desired_state == DesiredState.RUNNING
    audit = AuditEvent.objects.get(object_type="routing.scalingpolicy")
    assert (
        audit.after is not None
        and audit.after["scaling"] == UP
        and audit.after["metrics"]["waiting_total"] == 10.0
    )
    policy.refresh_from_db()
    assert policy.last_target_engines == 2


def test_a_second_run_in_the_same_interval_decides_nothing(template: Deployment, second_host: Host) -> None:
    policy = make_policy(template)
    set_live(template, waiting=10, running=8)
    assert autoscaler.evaluate(policy.pk, now=at(0)) is not None
    assert autoscaler.evaluate(policy.pk, now=at(5)) is None
    assert ScalingDecision.objects.count() == 1 and len(wanted_running(policy)) == 2


def test_no_scale_up_while_an_engine_starts_nor_within_the_cooldown(
    template: Deployment, second_host: Host
) -> None:
    policy = make_policy(template, scale_up_cooldown_s=60)
    set_live(template, waiting=10, running=8)
    autoscaler.evaluate(policy.pk, now=at(0))
    # The new engine is still starting: the scaler waits for it.
    assert autoscaler.evaluate(policy.pk, now=at(10)) is None
    policy.refresh_from_db()
    assert "starting" in policy.last_reason
    settle(policy)
    for dep in wanted_running(policy):
        set_live(dep, waiting=30, running=16)
    assert autoscaler.evaluate(policy.pk, now=at(20)) is None
    policy.refresh_from_db()
    assert "cooldown" in policy.last_reason
    decision = autoscaler.evaluate(policy.pk, now=at(60))
    assert decision is not None and decision.action == UP
    # 92 requests in the pool, an engine runs 16 (max_num_seqs) and may have 2 waiting: 6 wanted, 4 at most.
    assert (decision.engines_before, decision.engines_after) == (2, 4)


def test_idle_pool_drains_the_scaled_engine_and_keeps_the_template(
    template: Deployment, second_host: Host
) -> None:
    policy = make_policy(template, scale_down_cooldown_s=120)
    set_live(template, waiting=10, running=8)
    autoscaler.evaluate(policy.pk, now=at(0))
    settle(policy)
    engines = wanted_running(policy)
    for dep in engines:
        set_live(dep, waiting=0, running=1, kv=0.05)
    # Idle from 60 s on: the pool must stay quiet for the whole scale-down cooldown first.
    assert autoscaler.evaluate(policy.pk, now=at(60)) is None
    assert autoscaler.evaluate(policy.pk, now=at(170)) is None
    decision = autoscaler.evaluate(policy.pk, now=at(180))
    assert decision is not None and decision.action == DOWN
    removed = Deployment.objects.get(pk=decision.metrics["removed_id"])
    assert removed.pk != template.pk
    # Drained, not cut: the proxy drops it now (stopping), the agent stops it once its requests finish.
    assert removed.desired_state == DesiredState.STOPPED and removed.state == DeploymentState.STOPPING
    assert "Draining" in removed.state_reason
    assert wanted_running(policy) == [template]
    # At the minimum: nothing more to remove, and the stopped copy is deleted at the next evaluation.
    settle(policy)
    assert autoscaler.evaluate(policy.pk, now=at(400)) is None
    assert not Deployment.objects.filter(pk=removed.pk).exists()
    assert ScalingDecision.objects.filter(action=DOWN).get().deployment_name == removed.name


def test_load_between_the_targets_moves_nothing(template: Deployment, second_host: Host) -> None:
    policy = make_policy(template)
    set_live(template, waiting=10, running=8)
    autoscaler.evaluate(policy.pk, now=at(0))
    settle(policy)
    # 3 waiting over 2 engines: under the target (2 each), above half of it with one engine fewer.
    for dep in wanted_running(policy):
        set_live(dep, waiting=1.5, kv=0.3)
    for step in range(1, 20):
        assert autoscaler.evaluate(policy.pk, now=at(step * 10)) is None
    assert ScalingDecision.objects.count() == 1


def test_an_oscillating_load_does_not_flap(template: Deployment, second_host: Host) -> None:
    policy = make_policy(template, scale_up_cooldown_s=30, scale_down_cooldown_s=120)
    intervals = 60  # 10 minutes at 10 s
    for step in range(intervals):
        settle(policy)
        high = (step // 2) % 2 == 0  # the load swings every 20 s
        engines = wanted_running(policy)
        per_engine = 12.0 / len(engines) if high else 0.0
        for dep in engines:
            set_live(dep, waiting=per_engine, running=4, kv=0.6 if high else 0.05)
        autoscaler.evaluate(policy.pk, now=at(step * 10))
    decisions = list(ScalingDecision.objects.order_by("at").values_list("action", flat=True))
    # It grows to what the peaks need and stays there: a lull of 20 s never lasts the 120 s of quiet a
    # scale-down needs, so the pool is never shrunk only to be grown again at the next peak.
    assert decisions.count(UP) <= 3
    assert decisions.count(DOWN) == 0
    assert len(wanted_running(policy)) <= policy.max_engines


def test_busy_and_quiet_spells_move_the_pool_only_the_way_each_spell_asks(
    template: Deployment, second_host: Host
) -> None:
    policy = make_policy(template, scale_up_cooldown_s=20, scale_down_cooldown_s=40)
    moves: list[tuple[bool, str]] = []
    for step in range(60):  # 10 minutes: 100 s busy, 100 s quiet, three times
        settle(policy)
        busy = (step // 10) % 2 == 0
        engines = wanted_running(policy)
        # Busy: 40 requests, each engine runs up to 16 (its max_num_seqs), the rest wait.
        running = min(16.0, 40.0 / len(engines)) if busy else 0.0
        waiting = max(0.0, 40.0 - 16.0 * len(engines)) / len(engines) if busy else 0.0
        for dep in engines:
            set_live(dep, waiting=waiting, running=running, kv=0.5 if busy else 0.02)
        decision = autoscaler.evaluate(policy.pk, now=at(step * 10))
        if decision is not None:
            moves.append((busy, decision.action))
    # Up only while busy, down only while quiet: the pool never moves against the load.
    assert all(action == UP for busy, action in moves if busy)
    assert all(action == DOWN for busy, action in moves if not busy)
    ups = sum(1 for _, action in moves if action == UP)
    downs = sum(1 for _, action in moves if action == DOWN)
    # 40 requests want 3 engines (16 running + 2 waiting each), reached in one step from 1; each quiet
    # spell of 100 s takes back at most two (40 s quiet and 40 s since the last change each).
    assert moves[0] == (True, UP) and ups <= 3 and 2 <= downs <= 6


def test_a_host_lost_during_scale_up_is_replaced_elsewhere_not_duplicated(
    template: Deployment, second_host: Host
) -> None:
    policy = make_policy(template)
    set_live(template, waiting=10, running=8)
    first = autoscaler.evaluate(policy.pk, now=at(0))
    assert first is not None
    lost = Deployment.objects.get(pk=first.metrics["added_ids"][0])
    assert lost.host == second_host
    # node-b stops heartbeating before the engine is up.
    Host.objects.filter(pk=second_host.pk).update(last_heartbeat=timezone.now() - timedelta(hours=1))

    decision = autoscaler.evaluate(policy.pk, now=at(10))

    assert decision is not None and decision.action == ScalingDecision.Action.REPLACE
    lost.refresh_from_db()
    assert lost.desired_state == DesiredState.STOPPED
    replacement = Deployment.objects.get(pk=decision.metrics["added_ids"][0])
    assert replacement.host == template.host and replacement.pk != lost.pk
    assert [d.pk for d in wanted_running(policy)] == [template.pk, replacement.pk]
    # The next interval sees one engine starting: no second replacement, no extra scale-up.
    assert autoscaler.evaluate(policy.pk, now=at(20)) is None
    assert len(wanted_running(policy)) == 2


def test_at_the_maximum_the_wish_is_recorded_once(template: Deployment, second_host: Host) -> None:
    policy = make_policy(template, max_engines=1)
    set_live(template, waiting=10, running=8)
    first = autoscaler.evaluate(policy.pk, now=at(0))
    assert first is not None and first.action == ScalingDecision.Action.BLOCKED
    assert "maximum of 1" in first.reason
    for step in range(1, 10):
        assert autoscaler.evaluate(policy.pk, now=at(step * 10)) is None
    assert ScalingDecision.objects.count() == 1


def test_no_host_fits_blocks_with_the_reasons(template: Deployment, second_host: Host) -> None:
    Host.objects.filter(pk=second_host.pk).update(role="other")
    # The only host of the role holds the template (45%); a second 60% copy does not fit beside it.
    Deployment.objects.filter(pk=template.pk).update(gpu_memory_utilization=0.6)
    template.refresh_from_db()
    policy = make_policy(template)
    set_live(template, waiting=10, running=8)
    decision = autoscaler.evaluate(policy.pk, now=at(0))
    assert decision is not None and decision.action == ScalingDecision.Action.BLOCKED
    assert "No host fits" in decision.reason and "already taken" in decision.reason
    assert len(wanted_running(policy)) == 1


def test_silent_engines_are_never_taken_as_idle(template: Deployment, second_host: Host) -> None:
    policy = make_policy(template, min_engines=1)
    set_live(template, waiting=10, running=8)
    autoscaler.evaluate(policy.pk, now=at(0))
    settle(policy)
    from tests.conftest import wipe_run_keys

    wipe_run_keys()  # the engines go silent: this run's live keys vanish (other workers share the server)
    for step in range(1, 20):
        assert autoscaler.evaluate(policy.pk, now=at(step * 10)) is None
    assert len(wanted_running(policy)) == 2


def test_a_saturated_pool_without_a_queue_is_not_shrunk(template: Deployment, second_host: Host) -> None:
    Deployment.objects.filter(pk=template.pk).update(max_num_seqs=8)
    template.refresh_from_db()
    policy = make_policy(template, scale_down_cooldown_s=20)
    set_live(template, waiting=10, running=8)
    autoscaler.evaluate(policy.pk, now=at(0))
    settle(policy)
    # Every engine runs 8 (its most) and nothing waits: one engine fewer would queue 8 requests.
    for dep in wanted_running(policy):
        set_live(dep, waiting=0, running=8, kv=0.3)
    for step in range(1, 20):
        assert autoscaler.evaluate(policy.pk, now=at(step * 10)) is None
    assert len(wanted_running(policy)) == 2
    # Half the load: the 8 requests fit on one engine, so the copy goes.
    for dep in wanted_running(policy):
        set_live(dep, waiting=0, running=4, kv=0.15)
    actions = [autoscaler.evaluate(policy.pk, now=at(step * 10)) for step in range(20, 25)]
    assert [d.action for d in actions if d is not None] == [DOWN]
