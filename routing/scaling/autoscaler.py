"""The pool autoscaler: read a pool's live state, decide, place or drain engines, keep the history.

One evaluation per policy and interval (`evaluate`, called by the beat task in routing/scaling/tasks.py):

- the pool's engines are the deployments a RoutePool routes to (served name = the pool's alias, the
  pool's version or the alias's active one, the pool's role if it has one) that are wanted running;
- their live records (what the agents publish to Redis each second) give waiting requests, KV-cache
  usage and TTFT p95, the last compared with the template's newest performance baseline;
- `decide` (a pure function) picks scale up, scale down or hold, with cooldowns and a dead band:
  it adds engines when any target is exceeded, and removes one only when the pool would still be
  under half of every target with one engine fewer, so a load between the two moves nothing;
- a new engine is a copy of the template placed by the preflight/fit check on the least-loaded
  host of the pool's role; removing one drains it first (request_stop with drain: the proxy stops
  sending it requests at once, the agent stops it when its in-flight requests have finished).

Every decision is written to the pool's history (ScalingDecision, unique per policy and interval, so
a task run twice decides once) and to the audit log.
"""

from __future__ import annotations

import itertools
import logging
import math
import secrets
import socket
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from core.audit import record_audit
from core.choices import AuditAction
from core.redis_client import publish_config_change
from models_registry.estimate import VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
from models_registry.models import ModelAlias
from models_registry.services import fit_check
from nodes import baselines, services
from nodes.choices import ACTIVE_STATES, DeploymentState, DesiredState, Engine
from nodes.lifecycle import host_is_reachable, live_deployment_key, read_live_many
from nodes.models import Deployment, Gpu, Host, PerformanceBaseline
from nodes.preflight import preflight
from nodes.spec import DeploySpec
from routing.scaling.models import ScalingDecision, ScalingPolicy

log = logging.getLogger(__name__)

# Scale down only when, with one engine fewer, every measure would be at most this share of its target:
# the dead band between it and the target is what keeps a pool from flapping.
SCALE_DOWN_HEADROOM = 0.5
# A scale-up for KV usage or TTFT at most doubles the pool (their ratios to the target overstate what
# an engine more removes); one for waiting requests sizes the pool by capacity (see decide).
MAX_GROWTH_FACTOR = 2.0
# Engine parameters a scaled engine copies from the template.
TEMPLATE_FIELDS = (
    "model_version",
    "quantization",
    "engine",
    "gpu_memory_utilization",
    "max_model_len",
    "block_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "quantization_override",
    "enable_prefix_caching",
    "extra_args",
    "served_model_name",
)
STARTING_STATES = frozenset({DeploymentState.PENDING, DeploymentState.VERIFYING, DeploymentState.STARTING})
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
MAX_GPU_SETS_PER_HOST = 64


# --- the pool and its live state ----------------------------------------------------------------


def pool_version_id(pool: Any) -> int | None:
    """The version the pool serves: its own when pinned, else its alias's active one (as the proxy)."""
    if pool.model_version_id:
        return int(pool.model_version_id)
    alias = ModelAlias.objects.filter(name=pool.alias).values_list("active_version_id", flat=True).first()
    return int(alias) if alias is not None else None


def pool_deployments(pool: Any) -> Any:
    """The deployments wanted running that the proxy counts (or will count, once ready) in the pool."""
    rows = Deployment.objects.select_related("host").filter(
        served_model_name=pool.alias, desired_state=DesiredState.RUNNING
    )
    version = pool_version_id(pool)
    if version is not None:
        rows = rows.filter(model_version_id=version)
    if pool.role:
        rows = rows.filter(role=pool.role)
    return rows


def candidate_hosts(pool: Any) -> Any:
    """Hosts of the pool's role (every host when the pool has none)."""
    hosts = Host.objects.all()
    return hosts.filter(role=pool.role) if pool.role else hosts


@dataclass
class PoolState:
    """What the scaler decides on: the pool's engines and their live numbers, summed."""

    serving: list[Deployment] = field(default_factory=list)
    starting: list[Deployment] = field(default_factory=list)
    live: dict[int, dict[str, Any]] = field(default_factory=dict)
    waiting_total: float = 0.0
    running_total: float = 0.0
    kv_usage: float | None = None
    ttft_ratio: float | None = None
    max_running: float = 0.0
    # Requests one engine runs at once: the template's max_num_seqs when set, or the busiest engine's
    # running count now if that is higher (engines are copies of the template).
    engine_capacity: float = 0.0

    @property
    def engines(self) -> int:
        return len(self.serving) + len(self.starting)

    @property
    def waiting_per_engine(self) -> float | None:
        reporting = [d for d in self.serving if d.pk in self.live]
        return self.waiting_total / len(reporting) if reporting else None

    def metrics(self) -> dict[str, Any]:
        def r(value: float | None) -> float | None:
            return None if value is None else round(value, 4)

        return {
            "serving": len(self.serving),
            "starting": len(self.starting),
            "reporting": sum(1 for d in self.serving if d.pk in self.live),
            "waiting_total": r(self.waiting_total),
            "running_total": r(self.running_total),
            "waiting_per_engine": r(self.waiting_per_engine),
            "kv_usage": r(self.kv_usage),
            "ttft_ratio": r(self.ttft_ratio),
        }


def read_pool_state(policy: ScalingPolicy, rows: list[Deployment] | None = None) -> PoolState:
    """The pool's engines (serving and starting) and their live records from Redis (one MGET)."""
    rows = list(pool_deployments(policy.pool)) if rows is None else rows
    state = PoolState(
        serving=[d for d in rows if d.state == DeploymentState.READY],
        starting=[d for d in rows if d.state in STARTING_STATES and host_is_reachable(d.host)],
    )
    by_key = read_live_many([live_deployment_key(d.pk) for d in state.serving])
    state.live = {
        d.pk: by_key[live_deployment_key(d.pk)] for d in state.serving if live_deployment_key(d.pk) in by_key
    }
    if not state.live:
        return state
    kv: list[float] = []
    baseline = PerformanceBaseline.objects.filter(deployment_id=policy.template_id).first()
    for live in state.live.values():
        state.waiting_total += float(live.get("num_requests_waiting") or 0)
        state.running_total += float(live.get("num_requests_running") or 0)
        state.max_running = max(state.max_running, float(live.get("num_requests_running") or 0))
        if live.get("kv_cache_usage_perc") is not None:
            kv.append(float(live["kv_cache_usage_perc"]))
        if baseline is not None and policy.target_ttft_ratio is not None:
            ratio = baselines.compare(baseline, live).get("ratio")
            if ratio is not None:
                state.ttft_ratio = max(state.ttft_ratio or 0.0, float(ratio))
    state.kv_usage = sum(kv) / len(kv) if kv else None
    state.engine_capacity = max(state.max_running, float(policy.template.max_num_seqs or 0))
    return state


# --- the decision (pure) ------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What to do: `action` is a ScalingDecision.Action or "hold"; `target` the engine count wanted."""

    action: str
    target: int
    reason: str


HOLD = "hold"


def _since(then: datetime | None, now: datetime) -> float:
    return math.inf if then is None else (now - then).total_seconds()


def projected_waiting(state: PoolState, engines: int) -> float:
    """Waiting requests per engine if the pool's requests ran on `engines` engines.

    Each engine runs at most `engine_capacity` requests at once; the rest would wait. Counting the
    running requests matters: a saturated pool shows no queue, yet
    it would grow one as soon as it lost an engine.
    """
    total = state.running_total + state.waiting_total
    return max(0.0, total - engines * state.engine_capacity) / max(1, engines)


def is_quiet(policy: ScalingPolicy, state: PoolState) -> bool:
    """Whether the pool would be at most SCALE_DOWN_HEADROOM of every target with one engine fewer."""
    n = state.engines
    if n <= 1 or not state.live or state.starting or len(state.live) < len(state.serving):
        return False
    fewer = n - 1
    quiet = projected_waiting(state, fewer) <= SCALE_DOWN_HEADROOM * policy.target_waiting_per_engine and (
        (state.kv_usage or 0.0) * n / fewer <= SCALE_DOWN_HEADROOM * policy.target_kv_usage
    )
    if policy.target_ttft_ratio is not None and state.ttft_ratio is not None:
        quiet = quiet and state.ttft_ratio <= 1.0
    return quiet


def quiet_reason(policy: ScalingPolicy, state: PoolState) -> str:
    n = state.engines
    fewer = max(1, n - 1)
    return (
        f"with {fewer} engine(s) {projected_waiting(state, fewer):.1f} waiting per engine and KV cache "
        f"{(state.kv_usage or 0.0) * n / fewer:.0%}, at most {SCALE_DOWN_HEADROOM:.0%} of the targets"
    )


def decide(
    policy: ScalingPolicy,
    state: PoolState,
    *,
    last_change_at: datetime | None,
    quiet_since: datetime | None,
    now: datetime,
) -> Decision:
    """Scale up, scale down or hold, from the pool's state and the time of its last change.

    Bounds first (below the minimum: up at once; above the maximum: down). Then up when any measure
    exceeds its target, to the most engines any exceeded measure wants, once the engines already
    starting are up and the scale-up cooldown has passed; down by one when the pool would still be at
    most SCALE_DOWN_HEADROOM of every target with one engine fewer (`is_quiet`), has been so without a
    break since `quiet_since` for the scale-down cooldown, and as long since the last change.
    No live numbers: hold (an engine that does not report is never taken as idle).
    """
    n = state.engines
    lo, hi = policy.min_engines, policy.max_engines
    if n < lo:
        return Decision(ScalingDecision.Action.SCALE_UP, lo, f"{n} engines, below the minimum of {lo}.")
    if n > hi:
        return Decision(ScalingDecision.Action.SCALE_DOWN, n - 1, f"{n} engines, above the maximum of {hi}.")
    if not state.serving or not state.live:
        return Decision(HOLD, n, "No live numbers from the pool's engines yet.")

    # Each exceeded measure says how many engines it wants. Waiting requests: the requests in the pool
    # (running + waiting) over what one engine holds at the target (the most any engine runs at once
    # plus the waiting allowed), since queues do not shrink in proportion to engines. KV usage and TTFT:
    # in proportion to their ratio to the target, at most doubling.
    wants: list[tuple[int, str]] = []
    wpe = state.waiting_per_engine or 0.0
    target_wait = policy.target_waiting_per_engine
    if wpe > target_wait:
        # Engines are copies of one template: what one runs at once is its max_num_seqs or what the busiest
        # runs (an engine that just became ready has not taken its share yet and would understate it).
        per_engine = state.engine_capacity + target_wait
        wanted = math.ceil((state.running_total + state.waiting_total) / per_engine) if per_engine > 0 else hi
        wants.append((wanted, f"{wpe:.1f} waiting per engine > {target_wait:g}"))
    if state.kv_usage is not None and state.kv_usage > policy.target_kv_usage:
        ratio = state.kv_usage / policy.target_kv_usage
        wants.append(
            (
                math.ceil(n * min(ratio, MAX_GROWTH_FACTOR)),
                f"KV cache {state.kv_usage:.0%} > {policy.target_kv_usage:.0%}",
            )
        )
    target_ttft = policy.target_ttft_ratio
    if target_ttft is not None and state.ttft_ratio is not None and state.ttft_ratio > target_ttft:
        ratio = state.ttft_ratio / target_ttft
        wants.append(
            (
                math.ceil(n * min(ratio, MAX_GROWTH_FACTOR)),
                f"TTFT p95 {state.ttft_ratio:.1f}x the baseline > {target_ttft:g}x",
            )
        )

    since = _since(last_change_at, now)
    if wants:
        why = "; ".join(text for _, text in wants)
        if n >= hi:
            return Decision(
                ScalingDecision.Action.BLOCKED, n, f"{why}, but the pool is at its maximum of {hi}."
            )
        if state.starting:
            return Decision(HOLD, n, f"{why}; waiting for {len(state.starting)} starting engine(s).")
        if since < policy.scale_up_cooldown_s:
            return Decision(
                HOLD, n, f"{why}; scale-up cooldown ({since:.0f} of {policy.scale_up_cooldown_s} s)."
            )
        return Decision(ScalingDecision.Action.SCALE_UP, min(hi, max(n + 1, *(w for w, _ in wants))), why)

    if n <= lo or state.starting or quiet_since is None:
        return Decision(HOLD, n, "Within the targets.")
    quiet_for = _since(quiet_since, now)
    why = f"quiet for {quiet_for:.0f} s: {quiet_reason(policy, state)}"
    wait = policy.scale_down_cooldown_s
    if quiet_for < wait or since < wait:
        return Decision(
            HOLD, n, f"Idle, {why}; scale-down waits {wait} s quiet and {wait} s since the last change."
        )
    return Decision(ScalingDecision.Action.SCALE_DOWN, n - 1, f"Idle, {why}.")


# --- placement ----------------------------------------------------------------------------------


def _reserved_by_gpu(host: Host) -> dict[int, float]:
    """The share of each GPU's memory that the host's active deployments reserve."""
    held: dict[int, float] = {}
    for dep in Deployment.objects.filter(host=host, state__in=ACTIVE_STATES).exclude(
        desired_state=DesiredState.STOPPED, state=DeploymentState.STOPPED
    ):
        util = dep.gpu_memory_utilization
        for index in dep.gpu_indices or []:
            held[index] = held.get(index, 0.0) + (
                VLLM_DEFAULT_GPU_MEMORY_UTILIZATION if util is None else util
            )
    return held


def _host_load(host: Host) -> tuple[float, int, str]:
    gpus = list(host.gpus.values_list("index", flat=True))
    held = _reserved_by_gpu(host)
    share = sum(held.get(i, 0.0) for i in gpus) / len(gpus) if gpus else 0.0
    engines = Deployment.objects.filter(host=host, state__in=ACTIVE_STATES).count()
    return (share, engines, host.name)


def _port_is_free(host: Host, port: int) -> bool:
    if host.address not in LOOPBACK:
        return True
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(host: Host, start: int) -> int | None:
    """The lowest port from `start` that no deployment on a host of the same address holds."""
    used = set(Deployment.objects.filter(host__address=host.address).values_list("port", flat=True))
    for port in range(max(1024, start), 65536):
        if port not in used and _port_is_free(host, port):
            return port
    return None


def _gpu_sets(host: Host, size: int) -> list[tuple[int, ...]]:
    """GPU index sets of `size`, least-reserved GPUs first."""
    held = _reserved_by_gpu(host)
    indices = sorted(host.gpus.values_list("index", flat=True), key=lambda i: (held.get(i, 0.0), i))
    return list(itertools.islice(itertools.combinations(indices, size), MAX_GPU_SETS_PER_HOST))


@dataclass
class Placement:
    host: Host
    gpu_indices: tuple[int, ...]
    port: int


def find_placement(
    policy: ScalingPolicy, *, exclude_hosts: frozenset[int] = frozenset()
) -> tuple[Placement | None, str]:
    """The first host of the pool's role (least loaded first) and GPUs where the template passes preflight.

    Returns (None, why) when nothing fits, naming each host's refusal.
    """
    template = policy.template
    refusals: list[str] = []
    hosts = [h for h in candidate_hosts(policy.pool).prefetch_related("gpus") if h.pk not in exclude_hosts]
    for host in sorted(hosts, key=_host_load):
        port = free_port(host, template.port + 1)
        if port is None:
            refusals.append(f"{host.name}: no free port")
            continue
        world = template.tensor_parallel_size * template.pipeline_parallel_size
        sets: list[tuple[int, ...]] = [()] if template.engine == Engine.LLAMACPP else _gpu_sets(host, world)
        last = f"{host.name}: no {world} GPU(s)"
        for gpu_indices in sets:
            values = {
                name: getattr(template, name) for name in TEMPLATE_FIELDS if name != "served_model_name"
            }
            spec = DeploySpec.from_values(
                {**values, "host": host, "port": port, "gpu_indices": list(gpu_indices)}
            )
            check = preflight(spec)
            if check.ok:
                return Placement(host, gpu_indices, port), ""
            last = f"{host.name}: {check.summary()}"
            if "host" in check.errors:
                break  # unreachable or draining: no GPU set will do
        refusals.append(last)
    return None, "No host fits a new engine. " + (" | ".join(refusals) or "The pool's role has no host.")


def launch_copy(policy: ScalingPolicy, placement: Placement) -> Deployment:
    """A new deployment copying the template onto `placement`, its launch queued on commit."""
    template = policy.template
    base = template.name[:70]
    deployment = Deployment.objects.create(
        name=f"{base}-scaled-{secrets.token_hex(3)}",
        host=placement.host,
        gpu_indices=list(placement.gpu_indices),
        port=placement.port,
        role=policy.pool.role or template.role,
        **{name: getattr(template, name) for name in TEMPLATE_FIELDS},
    )
    publish_config_change("deployment", id=deployment.pk)
    services.request_start(deployment, f"Added by the scaler of pool {policy.pool.name}; launch queued.")
    return deployment


def _scaled_by(policy: ScalingPolicy) -> set[int]:
    """Ids of the deployments this policy's scaler added (they may be removed again)."""
    rows = policy.decisions.filter(
        action__in=[ScalingDecision.Action.SCALE_UP, ScalingDecision.Action.REPLACE]
    ).values_list("metrics", flat=True)
    out: set[int] = set()
    for metrics in rows:
        out.update(int(i) for i in (metrics or {}).get("added_ids", []))
    return out


def pick_for_removal(policy: ScalingPolicy, state: PoolState) -> Deployment:
    """The least useful serving engine: not the template, fewest requests in flight, newest first."""

    def key(dep: Deployment) -> tuple[int, float, float]:
        live = state.live.get(dep.pk, {})
        load = float(live.get("num_requests_running") or 0) + float(live.get("num_requests_waiting") or 0)
        return (int(dep.pk == policy.template_id), load, -dep.pk)

    return min(state.serving, key=key)


def _lost_engines(policy: ScalingPolicy, rows: list[Deployment]) -> list[Deployment]:
    """Engines the scaler added that never served and cannot now: host gone, or refused at launch."""
    mine = _scaled_by(policy)
    return [
        d
        for d in rows
        if d.pk in mine
        and d.state != DeploymentState.READY
        and (d.state == DeploymentState.FAILED or not host_is_reachable(d.host))
    ]


def _forget_removed(policy: ScalingPolicy) -> None:
    """Delete the scaler's own engines once they are stopped (their history stays in the decisions)."""
    stopped = Deployment.objects.filter(
        pk__in=_scaled_by(policy), desired_state=DesiredState.STOPPED, state=DeploymentState.STOPPED
    ).exclude(pk=policy.template_id)
    for dep in stopped:
        if not dep.scaling_templates.exists():
            dep.delete()
            publish_config_change("deployment", id=dep.pk)


# --- one evaluation -----------------------------------------------------------------------------


def _last_change_at(policy: ScalingPolicy, state: PoolState) -> datetime | None:
    """The last change of the pool: its latest scaling decision, or an engine becoming ready since.

    Counting readiness keeps the cooldowns from judging new capacity before it has taken load.
    """
    decided = (
        policy.decisions.filter(
            action__in=[
                ScalingDecision.Action.SCALE_UP,
                ScalingDecision.Action.SCALE_DOWN,
                ScalingDecision.Action.REPLACE,
            ]
        )
        .values_list("at", flat=True)
        .first()
    )
    times = [t for t in (decided, *(d.ready_at for d in state.serving)) if t is not None]
    return max(times) if times else None


def _record(
    policy: ScalingPolicy,
    *,
    now: datetime,
    interval: int,
    action: str,
    reason: str,
    before: int,
    after: int,
    metrics: dict[str, Any],
    deployments: list[Deployment],
) -> ScalingDecision:
    decision = ScalingDecision.objects.create(
        policy=policy,
        at=now,
        interval=interval,
        action=action,
        reason=reason,
        engines_before=before,
        engines_after=after,
        metrics=metrics,
        deployment=deployments[0] if deployments else None,
        deployment_name=", ".join(d.name for d in deployments)[:100],
        host_name=", ".join(sorted({d.host.name for d in deployments}))[:63],
    )
    record_audit(
        actor=None,
        action=AuditAction.ACTION,
        obj=policy,
        after={
            "scaling": action,
            "pool": policy.pool.name,
            "reason": reason,
            "engines_before": before,
            "engines_after": after,
            "deployments": [d.name for d in deployments],
            "metrics": metrics,
        },
    )
    return decision


def evaluate(policy_id: int, *, now: datetime | None = None) -> ScalingDecision | None:
    """One evaluation of a policy: the decision recorded (None when it held or already ran this interval)."""
    now = now or timezone.now()
    with transaction.atomic():
        policy = (
            ScalingPolicy.objects.select_for_update()
            .select_related("pool", "template")
            .filter(pk=policy_id, enabled=True)
            .first()
        )
        if policy is None:
            return None
        interval = int(now.timestamp() // max(1, policy.evaluation_interval_s))
        if policy.decisions.filter(interval=interval).exists():
            return None  # decided already in this interval (a task run twice)
        _forget_removed(policy)
        rows = list(pool_deployments(policy.pool))
        lost = _lost_engines(policy, rows)
        state = read_pool_state(policy, [d for d in rows if d not in lost])
        metrics = state.metrics()
        decision: ScalingDecision | None = None
        if lost:
            decision = _replace(policy, lost, state, now=now, interval=interval, metrics=metrics)
            target, reason = state.engines + len(lost), decision.reason
        else:
            if is_quiet(policy, state):
                policy.quiet_since = policy.quiet_since or now
            else:
                policy.quiet_since = None
            choice = decide(
                policy,
                state,
                last_change_at=_last_change_at(policy, state),
                quiet_since=policy.quiet_since,
                now=now,
            )
            target, reason = choice.target, choice.reason
            decision = _apply(policy, choice, state, now=now, interval=interval, metrics=metrics)
            if decision is not None:
                reason = decision.reason
        policy.last_evaluated_at = now
        policy.last_target_engines = target
        policy.last_reason = reason
        policy.last_metrics = metrics
        if decision is not None and decision.action != ScalingDecision.Action.BLOCKED:
            policy.quiet_since = None  # a changed pool is quiet anew only from now
        policy.save(
            update_fields=[
                "last_evaluated_at",
                "last_target_engines",
                "last_reason",
                "last_metrics",
                "quiet_since",
            ]
        )
    return decision


def _apply(
    policy: ScalingPolicy,
    choice: Decision,
    state: PoolState,
    *,
    now: datetime,
    interval: int,
    metrics: dict[str, Any],
) -> ScalingDecision | None:
    n = state.engines
    record = {"now": now, "interval": interval, "before": n}
    if choice.action == ScalingDecision.Action.SCALE_UP:
        added: list[Deployment] = []
        why_not = ""
        for _ in range(choice.target - n):
            placement, why_not = find_placement(policy)
            if placement is None:
                break
            added.append(launch_copy(policy, placement))
        if not added:
            return _blocked(policy, f"{choice.reason}; {why_not}", metrics=metrics, **record)  # type: ignore[arg-type]
        reason = (
            choice.reason
            if len(added) == choice.target - n
            else f"{choice.reason}; only {len(added)} placed: {why_not}"
        )
        return _record(
            policy,
            action=ScalingDecision.Action.SCALE_UP,
            reason=reason,
            after=n + len(added),
            metrics={**metrics, "added_ids": [d.pk for d in added]},
            deployments=added,
            **record,  # type: ignore[arg-type]
        )
    if choice.action == ScalingDecision.Action.SCALE_DOWN:
        victim = pick_for_removal(policy, state) if state.serving else state.starting[-1]
        services.request_stop(victim, drain=True)
        return _record(
            policy,
            action=ScalingDecision.Action.SCALE_DOWN,
            reason=f"{choice.reason} Draining {victim.name}.",
            after=n - 1,
            metrics={**metrics, "removed_id": victim.pk},
            deployments=[victim],
            **record,  # type: ignore[arg-type]
        )
    if choice.action == ScalingDecision.Action.BLOCKED:
        return _blocked(policy, choice.reason, metrics=metrics, **record)  # type: ignore[arg-type]
    return None


def _blocked(
    policy: ScalingPolicy, reason: str, *, now: datetime, interval: int, before: int, metrics: dict[str, Any]
) -> ScalingDecision | None:
    """A wanted change that cannot happen: recorded once, not at every interval while it lasts."""
    last = policy.decisions.values_list("action", flat=True).first()
    if last == ScalingDecision.Action.BLOCKED:
        return None
    return _record(
        policy,
        now=now,
        interval=interval,
        action=ScalingDecision.Action.BLOCKED,
        reason=reason,
        before=before,
        after=before,
        metrics=metrics,
        deployments=[],
    )


def _replace(
    policy: ScalingPolicy,
    lost: list[Deployment],
    state: PoolState,
    *,
    now: datetime,
    interval: int,
    metrics: dict[str, Any],
) -> ScalingDecision:
    """Remove the scaler's engines that were lost before serving and place each again on another host."""
    gone_hosts = frozenset(d.host_id for d in lost)
    added: list[Deployment] = []
    why_not = ""
    for dep in lost:
        services.request_stop(dep)
        placement, why_not = find_placement(policy, exclude_hosts=gone_hosts)
        if placement is not None:
            added.append(launch_copy(policy, placement))
    names = ", ".join(f"{d.name} on {d.host.name} ({d.state})" for d in lost)
    reason = (
        f"Lost before serving: {names}; placed again on {', '.join(d.host.name for d in added) or 'no host'}."
    )
    if len(added) < len(lost):
        reason += f" {why_not}"
    return _record(
        policy,
        now=now,
        interval=interval,
        action=ScalingDecision.Action.REPLACE,
        reason=reason,
        before=state.engines + len(lost),
        after=state.engines + len(added),
        metrics={**metrics, "added_ids": [d.pk for d in added], "lost_ids": [d.pk for d in lost]},
        deployments=added or lost,
    )


def due_policy_ids(now: datetime | None = None) -> list[int]:
    """Enabled policies whose evaluation interval has passed since their last evaluation."""
    now = now or timezone.now()
    out = []
    for pk, last, every in ScalingPolicy.objects.filter(enabled=True).values_list(
        "pk", "last_evaluated_at", "evaluation_interval_s"
    ):
        if last is None or (now - last).total_seconds() >= every - 0.5:
            out.append(pk)
    return out


def evaluate_due(now: datetime | None = None) -> list[int]:
    """Evaluate every due policy; the ids of those that decided. One pool's error spares the others."""
    decided = []
    for pk in due_policy_ids(now):
        try:
            if evaluate(pk, now=now) is not None:
                decided.append(pk)
        except Exception:
            log.exception("scaling evaluation of policy %s failed", pk)
    return decided


# --- validation ---------------------------------------------------------------------------------


def _fits_somewhere(template: Deployment, hosts: list[Host]) -> tuple[bool, list[str]]:
    """Whether the template's memory fit check passes on the GPUs of any host (reservations aside)."""
    world = template.tensor_parallel_size * template.pipeline_parallel_size
    why: list[str] = []
    for host in hosts:
        gpus = sorted(Gpu.objects.filter(host=host), key=lambda g: -g.memory_total_bytes)[:world]
        if template.engine == Engine.LLAMACPP:
            return True, []
        if len(gpus) < world:
            why.append(f"{host.name} has {len(gpus)} GPU(s), the template needs {world}")
            continue
        spec = DeploySpec.from_deployment(template)
        try:
            fit = fit_check(
                spec.model_version,
                spec.quantization,
                sum(g.memory_total_bytes for g in gpus),
                spec.gpu_memory_utilization,
                spec.max_model_len,
                spec.max_num_seqs,
                tensor_parallel_size=spec.tensor_parallel_size,
                pipeline_parallel_size=spec.pipeline_parallel_size,
                gpu_name=gpus[0].name,
                max_num_batched_tokens=spec.max_num_batched_tokens,
            )
        except ValueError as exc:
            why.append(f"{host.name}: {exc}")
            continue
        if fit.fits:
            return True, []
        why.append(f"{host.name}: {fit.reason}")
    return False, why


def validate_policy(
    pool: Any, template: Deployment | None, min_engines: int, max_engines: int
) -> dict[str, list[str]]:
    """Field errors of a policy before it is saved: bounds, the pool's hosts, the template's fit."""
    errors: dict[str, list[str]] = {}
    if min_engines < 1:
        errors["min_engines"] = ["At least 1 (scale to zero is a separate choice)."]
    if max_engines < min_engines:
        errors["max_engines"] = [f"Must be at least min_engines ({min_engines})."]
    if pool is None:
        return errors
    hosts = list(candidate_hosts(pool))
    if not hosts:
        errors["pool"] = [
            f"No host has the role '{pool.role}' of pool {pool.name}; set a host's role or the pool's."
            if pool.role
            else "There is no host to place engines on."
        ]
        return errors
    if template is None:
        return errors
    if template.served_model_name != pool.alias:
        errors.setdefault("template", []).append(
            f"The template serves '{template.served_model_name}', the pool routes '{pool.alias}'."
        )
    version = pool_version_id(pool)
    if version is not None and template.model_version_id != version:
        errors.setdefault("template", []).append(
            f"The template runs {template.model_version}, not the version pool {pool.name} serves."
        )
    fits, why = _fits_somewhere(template, hosts)
    if not fits:
        errors.setdefault("template", []).append(
            "The template's fit check fails on every host of the pool's role: " + "; ".join(why)
        )
    return errors


def engine_counts(policy: ScalingPolicy) -> dict[str, int]:
    """The pool's engines now, for the console: serving, starting, and draining ones."""
    rows = list(pool_deployments(policy.pool))
    draining = Deployment.objects.filter(
        pk__in=_scaled_by(policy) | {policy.template_id}, state=DeploymentState.STOPPING
    ).count()
    return {
        "serving": sum(1 for d in rows if d.state == DeploymentState.READY),
        "starting": sum(1 for d in rows if d.state in STARTING_STATES),
        "draining": draining,
    }
