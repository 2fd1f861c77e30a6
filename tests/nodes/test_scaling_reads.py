"""What one scaler evaluation reads, in few queries: the policy's history, the hosts' loads for a placement,
and the pool's engines under the version its alias serves. The numbers must be the ones the per-row
reads gave (routing/scaling/autoscaler.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from models_registry.models import ModelAlias
from nodes.choices import DeploymentState, DesiredState
from nodes.models import Deployment, Host
from routing.scaling import autoscaler
from routing.scaling.models import ScalingDecision
from tests.nodes.conftest import make_host, register_llama
from tests.nodes.scaling_helpers import ROLE, at, make_policy, set_live

pytestmark = pytest.mark.django_db

Action = ScalingDecision.Action


@pytest.fixture
def template(host: Host, make_deployment: Any, node_settings: Any, redis_clean: None) -> Deployment:
    node_settings.NODE_UNREACHABLE_SECONDS = 3600
    Host.objects.filter(pk=host.pk).update(role=ROLE)
    return make_deployment(role=ROLE, state=DeploymentState.READY)


def test_the_history_read_once_gives_the_interval_the_scalers_engines_and_the_last_change(
    template: Deployment,
) -> None:
    policy = make_policy(template)

    def decide(seconds: float, action: str, **metrics: Any) -> None:
        moment = at(seconds)
        ScalingDecision.objects.create(
            policy=policy,
            at=moment,
            interval=int(moment.timestamp() // 10),
            action=action,
            reason="",
            engines_before=1,
            engines_after=1,
            metrics=metrics,
        )

    decide(0, Action.SCALE_UP, added_ids=[101, 102])
    decide(10, Action.REPLACE, added_ids=[103], lost_ids=[101])
    decide(20, Action.SCALE_DOWN, removed_id=102)
    decide(30, Action.BLOCKED, added_ids=[999])  # not an engine of the scaler's, nor a change
    interval = int(at(30).timestamp() // 10)

    history = autoscaler.read_history(policy, interval)
    assert history.decided_this_interval
    assert history.mine == {101, 102, 103} == autoscaler._scaled_by(policy)
    assert history.last_change_at == at(20)
    later = autoscaler.read_history(policy, interval + 1)
    assert not later.decided_this_interval and later.last_change_at == at(20)

    empty = autoscaler.read_history(make_policy_for_another_pool(template), interval)
    assert (empty.decided_this_interval, empty.mine, empty.last_change_at) == (False, set(), None)


def make_policy_for_another_pool(template: Deployment) -> Any:
    from routing.models import RoutePool
    from routing.scaling.models import ScalingPolicy

    pool = RoutePool.objects.create(name="other", alias=template.served_model_name, role=ROLE)
    return ScalingPolicy.objects.create(pool=pool, template=template)


def test_host_loads_are_the_per_host_reservations_and_counts(
    host: Host, template: Deployment, make_deployment: Any
) -> None:
    second = make_host("node-b", gpus=2)
    # On node-a (one GPU): the template (0.45 of GPU 0), a starting engine at the default utilization,
    # a stopping one (still reserved) and a stopped one (neither reserved nor counted).
    make_deployment(state=DeploymentState.STARTING, gpu_memory_utilization=None)
    make_deployment(
        state=DeploymentState.STOPPING, desired_state=DesiredState.STOPPED, gpu_memory_utilization=0.1
    )
    make_deployment(
        state=DeploymentState.STOPPED, desired_state=DesiredState.STOPPED, gpu_memory_utilization=0.3
    )
    # On node-b (two GPUs): one engine on GPU 1.
    make_deployment(host=second, gpu_indices=[1], state=DeploymentState.READY, gpu_memory_utilization=0.5)

    loads = autoscaler.host_loads([host, second])

    default = autoscaler.VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
    assert loads[host.pk] == autoscaler.HostLoad(gpus=[0], held={0: 0.45 + default + 0.1}, engines=3)
    assert loads[second.pk] == autoscaler.HostLoad(gpus=[0, 1], held={1: 0.5}, engines=1)
    assert loads[second.pk].key(second) == (0.25, 1, "node-b")
    assert autoscaler._host_load(host) == loads[host.pk].key(host)
    assert autoscaler._reserved_by_gpu(second) == {1: 0.5}
    # The least reserved GPU first.
    assert (
        autoscaler._gpu_sets(second, 1) == [(0,), (1,)] == autoscaler._gpu_sets(second, 1, loads[second.pk])
    )


def test_a_pool_counts_only_the_engines_of_the_version_its_alias_serves(
    host: Host, template: Deployment, make_deployment: Any, node_settings: Any
) -> None:
    other_version = register_llama(Path(node_settings.MODEL_ROOTS[0]), host.name, revision="v2")
    make_deployment(role=ROLE, state=DeploymentState.READY, model_version=other_version)
    policy = make_policy(template, max_engines=1)
    set_live(template, waiting=0, running=1, kv=0.1)

    # No alias of that name: every version's engines are the pool's (two, above the maximum of one).
    decision = autoscaler.evaluate(policy.pk, now=at(0))
    assert decision is not None and decision.action == Action.SCALE_DOWN
    assert decision.engines_before == 2

    # The alias serves the template's version: the other version's engine is not in the pool.
    ModelAlias.objects.create(name=template.served_model_name, active_version=template.model_version)
    Deployment.objects.filter(model_version=other_version).update(
        state=DeploymentState.READY, desired_state=DesiredState.RUNNING
    )
    autoscaler.evaluate(policy.pk, now=at(10))
    policy.refresh_from_db()
    assert policy.last_metrics["serving"] == 1 and policy.last_target_engines == 1
    assert autoscaler.pool_version_id(policy.pool) == template.model_version_id
    assert [d.pk for d in autoscaler.pool_engine_rows(policy.pool)] == [template.pk]


def test_a_tick_evaluates_every_due_policy_as_one_evaluation_each_would(
    host: Host, template: Deployment, make_deployment: Any, monkeypatch: Any
) -> None:
    from routing.models import RoutePool
    from routing.scaling.models import ScalingPolicy

    make_host("node-b", gpus=2)
    Host.objects.filter(name="node-b").update(role=ROLE)
    # Pool "a-fast" (the role's engines of the alias) is overloaded; pool "b-all" (every engine of the
    # alias) holds the same engines plus one of another role, within its targets until "a-fast" grows.
    other = make_deployment(
        role="other", state=DeploymentState.READY, served_model_name=template.served_model_name
    )
    fast = make_policy(template)
    RoutePool.objects.filter(pk=fast.pool_id).update(name="a-fast")
    every = ScalingPolicy.objects.create(
        pool=RoutePool.objects.create(name="b-all", alias=template.served_model_name),
        template=template,
        max_engines=4,
        evaluation_interval_s=10,
    )
    idle = make_policy_for_another_pool(template)
    ScalingPolicy.objects.filter(pk=idle.pk).update(enabled=False)
    set_live(template, waiting=10, running=16, kv=0.5)
    set_live(other, waiting=0, running=1, kv=0.1)

    assert autoscaler.evaluate_due(now=at(0)) == [fast.pk]

    fast.refresh_from_db()
    every.refresh_from_db()
    idle.refresh_from_db()
    [up] = ScalingDecision.objects.all()
    assert up.policy_id == fast.pk and up.action == Action.SCALE_UP and fast.last_target_engines == 2
    # "b-all" read its engines after "a-fast" added one: it waits for it instead of adding its own.
    assert every.last_evaluated_at == at(0) and "waiting for 1 starting engine" in every.last_reason
    assert every.last_metrics["serving"] == 2 and every.last_metrics["starting"] == 1
    assert idle.last_evaluated_at is None  # disabled
    # Not due again within the interval; a run of the same interval decides nothing.
    assert autoscaler.evaluate_due(now=at(5)) == []
    assert autoscaler.evaluate(fast.pk, now=at(5)) is None

    # One pool's error spares the others, and leaves its own policy as it was.
    real_decide = autoscaler.decide

    def failing(policy: Any, *args: Any, **kwargs: Any) -> Any:
        if policy.pk == every.pk:
            raise RuntimeError("boom")
        return real_decide(policy, *args, **kwargs)

    monkeypatch.setattr(autoscaler, "decide", failing)
    Deployment.objects.filter(desired_state=DesiredState.RUNNING).update(state=DeploymentState.READY)
    for dep in Deployment.objects.filter(role=ROLE):
        set_live(dep, waiting=0, running=8, kv=0.5)
    assert autoscaler.evaluate_due(now=at(20)) == []
    fast.refresh_from_db()
    every.refresh_from_db()
    assert fast.last_evaluated_at == at(20) and "Within the targets" in fast.last_reason
    assert fast.last_metrics["serving"] == 2 and fast.last_metrics["waiting_total"] == 0
    assert every.last_evaluated_at == at(0)


def test_after_a_pool_acts_only_the_pools_of_its_alias_read_their_engines_again(
    host: Host, template: Deployment, make_deployment: Any, monkeypatch: Any
) -> None:
    """The tick's bulk reads stay good for a pool of another alias: the acting pool changed only engines
    of its own alias (and placements read the hosts afresh)."""
    from routing.models import RoutePool

    make_host("node-b", gpus=2)
    Host.objects.filter(name="node-b").update(role=ROLE)
    fast = make_policy(template)
    RoutePool.objects.filter(pk=fast.pool_id).update(name="a-fast")
    other_template = make_deployment(role=ROLE, state=DeploymentState.READY, served_model_name="other-alias")
    other = make_policy(other_template)
    RoutePool.objects.filter(pk=other.pool_id).update(name="b-other", alias="other-alias")
    same = make_policy_for_another_pool(template)
    RoutePool.objects.filter(pk=same.pool_id).update(name="c-same")
    set_live(template, waiting=10, running=16, kv=0.5)  # a-fast and c-same: overloaded
    set_live(other_template, waiting=0, running=1, kv=0.1)

    read_again: list[str] = []
    real_rows = autoscaler.pool_engine_rows

    def rows(pool: Any, *args: Any, **kwargs: Any) -> Any:
        read_again.append(pool.name)
        return real_rows(pool, *args, **kwargs)

    monkeypatch.setattr(autoscaler, "pool_engine_rows", rows)
    assert autoscaler.evaluate_due(now=at(0)) == [fast.pk]
    # a-fast added an engine; c-same (its alias) read its engines again and waits for that one;
    # b-other kept the tick's read, and its figures are its own engine's.
    assert read_again == ["c-same"]
    same.refresh_from_db()
    other.refresh_from_db()
    assert "waiting for 1 starting engine" in same.last_reason
    assert other.last_evaluated_at == at(0) and "Within the targets" in other.last_reason
    assert other.last_metrics["serving"] == 1 and other.last_metrics["waiting_total"] == 0


def test_an_engine_that_reports_no_metrics_is_left_out_of_the_pools_kv_usage(
    template: Deployment, make_deployment: Any
) -> None:
    """A llama.cpp engine serves no metrics and publishes a placeholder KV of 0.0 with `has_metrics`
    false: the pool's KV usage is the reporting engines' alone, not pulled down by the placeholder."""
    quiet = make_deployment(role=ROLE, state=DeploymentState.READY)
    policy = make_policy(template)
    set_live(template, running=2, kv=0.9)
    set_live(quiet, running=1, kv=0.0, has_metrics=False)

    state = autoscaler.read_pool_state(policy)
    assert len(state.live) == 2 and state.running_total == 3.0
    assert state.kv_usage == pytest.approx(0.9)

    # Reporting, a 0.0 is a real figure and counts.
    set_live(quiet, running=1, kv=0.0)
    assert autoscaler.read_pool_state(policy).kv_usage == pytest.approx(0.45)
