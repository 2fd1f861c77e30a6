"""The pool autoscaler: read a pool's live state, decide, place or drain engines, keep the history.

One evaluation per policy and interval (`evaluate`; the beat task in routing/scaling/tasks.py runs
`evaluate_due`, which evaluates every due policy the same way with its reads done in bulk):

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
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Count, OuterRef, Q, Subquery
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


def pool_version_id(
    pool: Any, alias_version_id: int | None = None, *, alias_read: bool = False
) -> int | None:
    """The version the pool serves: its own when pinned, else its alias's active one (as the proxy).

    `alias_read`: the alias's active version is `alias_version_id`, read already (ALIAS_VERSION)."""
    if pool.model_version_id:
        return int(pool.model_version_id)
    if not alias_read:
        alias_version_id = (
            ModelAlias.objects.filter(name=pool.alias).values_list("active_version_id", flat=True).first()
        )
    return int(alias_version_id) if alias_version_id is not None else None


# The active version of a pool's alias, as a policy's annotation (`alias_version_id`): read with the policy.
ALIAS_VERSION = Subquery(
    ModelAlias.objects.filter(name=OuterRef("pool__alias")).values("active_version_id")[:1]
)


def pool_deployments(pool: Any, alias_version_id: int | None = None, *, alias_read: bool = False) -> Any:
    """The deployments wanted running that the proxy counts (or will count, once ready) in the pool.

    `alias_version_id`, `alias_read`: as for pool_version_id."""
    rows = Deployment.objects.select_related("host").filter(
        served_model_name=pool.alias, desired_state=DesiredState.RUNNING
    )
    version = pool_version_id(pool, alias_version_id, alias_read=alias_read)
    if version is not None:
        rows = rows.filter(model_version_id=version)
    if pool.role:
        rows = rows.filter(role=pool.role)
    return rows


# What an evaluation reads of each engine of the pool (a pool may have a hundred engines, evaluated every
# few seconds): the rest of a row (engine arguments, logs, launch record) is read only for the engine the
# scaler acts on (`_full`).
POOL_ROW_FIELDS = (
    "name",
    "state",
    "ready_at",
    "port",
    "host",
    "host__name",
    "host__state",
    "host__last_heartbeat",
)


def pool_engine_rows(
    pool: Any, alias_version_id: int | None = None, *, alias_read: bool = False
) -> list[Deployment]:
    """`pool_deployments` with only the fields an evaluation decides on (POOL_ROW_FIELDS)."""
    rows = pool_deployments(pool, alias_version_id, alias_read=alias_read)
    return list(rows.only(*POOL_ROW_FIELDS))


def _full(deployment: Deployment) -> Deployment:
    """The whole row of an engine read with POOL_ROW_FIELDS, for acting on it (stop, drain)."""
    return Deployment.objects.select_related("host").get(pk=deployment.pk)


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


UNREAD: Any = object()


def read_pool_state(
    policy: ScalingPolicy,
    rows: list[Deployment] | None = None,
    live_records: dict[str, dict[str, Any]] | None = None,
    baseline: Any = UNREAD,
) -> PoolState:
    """The pool's engines (serving and starting) and their live records from Redis (one MGET).

    `live_records`: the live records by key, read already (one MGET for all the pools of a tick); `baseline`:
    the template's newest performance baseline (or None), read already."""
    rows = pool_engine_rows(policy.pool) if rows is None else rows
    state = PoolState(
        serving=[d for d in rows if d.state == DeploymentState.READY],
        starting=[d for d in rows if d.state in STARTING_STATES and host_is_reachable(d.host)],
    )
    by_key = (
        read_live_many([live_deployment_key(d.pk) for d in state.serving])
        if live_records is None
        else live_records
    )
    state.live = {
        d.pk: by_key[live_deployment_key(d.pk)] for d in state.serving if live_deployment_key(d.pk) in by_key
    }
    if not state.live:
        return state
    kv: list[float] = []
    if baseline is UNREAD:
        baseline = (
            PerformanceBaseline.objects.filter(deployment_id=policy.template_id).first()
            if policy.target_ttft_ratio is not None
            else None  # TTFT is not a target of this policy: its baseline is not read
        )
    for live in state.live.values():
        state.waiting_total += float(live.get("num_requests_waiting") or 0)
        state.running_total += float(live.get("num_requests_running") or 0)
        state.max_running = max(state.max_running, float(live.get("num_requests_running") or 0))
        # An engine that serves no metrics (llama.cpp: `has_metrics` false) publishes a placeholder 0.0:
        # averaged in, it would read as free KV cache and hold a busy pool back from scaling up.
        if live.get("has_metrics", True) and live.get("kv_cache_usage_perc") is not None:
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
    return _reservations([host.pk]).get(host.pk, {})


def _reservations(host_ids: list[int]) -> dict[int, dict[int, float]]:
    """`_reserved_by_gpu` of several hosts in one query: host id -> GPU index -> share reserved."""
    held: dict[int, dict[int, float]] = {}
    rows = (
        Deployment.objects.filter(host_id__in=host_ids, state__in=ACTIVE_STATES)
        .exclude(desired_state=DesiredState.STOPPED, state=DeploymentState.STOPPED)
        .values_list("host_id", "gpu_memory_utilization", "gpu_indices")  # summed in the models' order
    )
    for host_id, util, indices in rows:
        by_gpu = held.setdefault(host_id, {})
        for index in indices or []:
            by_gpu[index] = by_gpu.get(index, 0.0) + (
                VLLM_DEFAULT_GPU_MEMORY_UTILIZATION if util is None else util
            )
    return held


@dataclass
class HostLoad:
    """What placement ranks a host by, and the GPUs it picks from: read for all candidates at once."""

    gpus: list[int]
    held: dict[int, float]
    engines: int

    def key(self, host: Host) -> tuple[float, int, str]:
        """Least-loaded first: the mean share of GPU memory reserved, then the engine count, then the name."""
        share = sum(self.held.get(i, 0.0) for i in self.gpus) / len(self.gpus) if self.gpus else 0.0
        return (share, self.engines, host.name)


def host_loads(hosts: list[Host]) -> dict[int, HostLoad]:
    """Each host's GPUs, reservations and active engines, in three queries whatever the number of hosts."""
    ids = [h.pk for h in hosts]
    gpus: dict[int, list[int]] = {pk: [] for pk in ids}
    for host_id, index in (
        Gpu.objects.filter(host_id__in=ids).order_by("index").values_list("host_id", "index")
    ):
        gpus[host_id].append(index)
    held = _reservations(ids)
    engines = dict(
        Deployment.objects.filter(host_id__in=ids, state__in=ACTIVE_STATES)
        .order_by()
        .values("host_id")
        .annotate(n=Count("pk"))
        .values_list("host_id", "n")
    )
    return {pk: HostLoad(gpus[pk], held.get(pk, {}), engines.get(pk, 0)) for pk in ids}


def _host_load(host: Host) -> tuple[float, int, str]:
    return host_loads([host])[host.pk].key(host)


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


def _gpu_sets(host: Host, size: int, load: HostLoad | None = None) -> list[tuple[int, ...]]:
    """GPU index sets of `size`, least-reserved GPUs first (`load`: the host's, when already read)."""
    load = load or host_loads([host])[host.pk]
    held = load.held
    indices = sorted(load.gpus, key=lambda i: (held.get(i, 0.0), i))
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
    hosts = [h for h in candidate_hosts(policy.pool) if h.pk not in exclude_hosts]
    loads = host_loads(hosts)
    for host in sorted(hosts, key=lambda h: loads[h.pk].key(h)):
        port = free_port(host, template.port + 1)
        if port is None:
            refusals.append(f"{host.name}: no free port")
            continue
        world = template.tensor_parallel_size * template.pipeline_parallel_size
        sets: list[tuple[int, ...]] = (
            [()] if template.engine == Engine.LLAMACPP else _gpu_sets(host, world, loads[host.pk])
        )
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


def _lost_engines(
    policy: ScalingPolicy, rows: list[Deployment], mine: set[int] | None = None
) -> list[Deployment]:
    """Engines the scaler added that never served and cannot now: host gone, or refused at launch.

    `mine`: the policy's `_scaled_by`, when already read."""
    mine = _scaled_by(policy) if mine is None else mine
    return [
        d
        for d in rows
        if d.pk in mine
        and d.state != DeploymentState.READY
        and (d.state == DeploymentState.FAILED or not host_is_reachable(d.host))
    ]


def _forget_removed(policy: ScalingPolicy, mine: set[int] | None = None) -> None:
    """Delete the scaler's own engines once they are stopped (their history stays in the decisions).

    `mine`: the policy's `_scaled_by`, when already read."""
    mine = _scaled_by(policy) if mine is None else mine
    if not mine:
        return
    stopped = Deployment.objects.filter(
        pk__in=mine, desired_state=DesiredState.STOPPED, state=DeploymentState.STOPPED
    ).exclude(pk=policy.template_id)
    for dep in stopped:
        if not dep.scaling_templates.exists():
            dep.delete()
            publish_config_change("deployment", id=dep.pk)


# --- one evaluation -----------------------------------------------------------------------------


CHANGES = (ScalingDecision.Action.SCALE_UP, ScalingDecision.Action.SCALE_DOWN, ScalingDecision.Action.REPLACE)
ADDING = (ScalingDecision.Action.SCALE_UP, ScalingDecision.Action.REPLACE)


@dataclass
class History:
    """What an evaluation needs of the policy's decisions, read in one query (`read_history`)."""

    decided_this_interval: bool
    # The ids of the engines the scaler added (`_scaled_by`).
    mine: set[int]
    # When the latest decision that changed the pool was taken (scale up, down or replace).
    last_change_at: datetime | None


def read_history(policy: ScalingPolicy, interval: int) -> History:
    """The decision of this interval if any, the scaler's engines and the last change, in one query."""
    rows = policy.decisions.filter(Q(interval=interval) | Q(action__in=CHANGES)).values_list(
        "interval", "action", "at", "metrics"
    )  # newest first (the model's ordering)
    return _history(rows, interval)


def _history(rows: Iterable[tuple[int, str, datetime, Any]], interval: int) -> History:
    """History of a policy's (interval, action, at, metrics) decisions, newest first."""
    history = History(decided_this_interval=False, mine=set(), last_change_at=None)
    for decided_in, action, at, metrics in rows:
        history.decided_this_interval |= decided_in == interval
        if action in CHANGES and history.last_change_at is None:
            history.last_change_at = at
        if action in ADDING:
            history.mine.update(int(i) for i in (metrics or {}).get("added_ids", []))
    return history


def _last_change_at(
    policy: ScalingPolicy, state: PoolState, decided: datetime | None = None, *, decided_read: bool = False
) -> datetime | None:
    """The last change of the pool: its latest scaling decision, or an engine becoming ready since.

    Counting readiness keeps the cooldowns from judging new capacity before it has taken load.
    `decided_read`: the latest decision's time is `decided`, read already (read_history).
    """
    if not decided_read:
        decided = policy.decisions.filter(action__in=CHANGES).values_list("at", flat=True).first()
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


POLICY_FIELDS = ("last_evaluated_at", "last_target_engines", "last_reason", "last_metrics", "quiet_since")


def _locked_policies(ids: list[int]) -> list[ScalingPolicy]:
    """These enabled policies, locked (in the model's order, the pools' names), with their pools, templates
    and their aliases' active versions (`alias_version_id`)."""
    return list(
        ScalingPolicy.objects.select_for_update()
        .select_related("pool", "template")
        .annotate(alias_version_id=ALIAS_VERSION)
        .filter(pk__in=ids, enabled=True)
    )


def evaluate(policy_id: int, *, now: datetime | None = None) -> ScalingDecision | None:
    """One evaluation of a policy: the decision recorded (None when it held or already ran this interval)."""
    now = now or timezone.now()
    with transaction.atomic():
        locked = _locked_policies([policy_id])
        if not locked:
            return None
        policy = locked[0]
        # Read once: deleting stopped engines leaves the decisions as they are, and no decision is
        # recorded before the last change is used.
        history = read_history(policy, _interval(policy, now))
        if history.decided_this_interval:
            return None  # decided already in this interval (a task run twice)
        _forget_removed(policy, history.mine)
        rows = pool_engine_rows(policy.pool, policy.alias_version_id, alias_read=True)  # type: ignore[attr-defined]
        plan = _plan(policy, now, history, rows)
        decision = _carry_out(policy, plan, now)
        policy.save(update_fields=POLICY_FIELDS)
    return decision


def _interval(policy: ScalingPolicy, now: datetime) -> int:
    return int(now.timestamp() // max(1, policy.evaluation_interval_s))


@dataclass
class Plan:
    """One evaluation before it acts: the pool's state, the engines lost, and what `decide` chose."""

    interval: int
    lost: list[Deployment]
    state: PoolState
    metrics: dict[str, Any]
    choice: Decision | None  # None when engines were lost (they are replaced)

    @property
    def holds(self) -> bool:
        return not self.lost and self.choice is not None and self.choice.action == HOLD


def _plan(
    policy: ScalingPolicy,
    now: datetime,
    history: History,
    rows: list[Deployment],
    live: dict[str, dict[str, Any]] | None = None,
    baseline: Any = UNREAD,
) -> Plan:
    """Read the pool's state and decide, writing nothing (the policy's quiet_since is set on the object)."""
    lost = _lost_engines(policy, rows, history.mine)
    state = read_pool_state(policy, [d for d in rows if d not in lost], live, baseline)
    plan = Plan(_interval(policy, now), lost, state, state.metrics(), None)
    if lost:
        return plan
    if is_quiet(policy, state):
        policy.quiet_since = policy.quiet_since or now
    else:
        policy.quiet_since = None
    plan.choice = decide(
        policy,
        state,
        last_change_at=_last_change_at(policy, state, history.last_change_at, decided_read=True),
        quiet_since=policy.quiet_since,
        now=now,
    )
    return plan


def _carry_out(policy: ScalingPolicy, plan: Plan, now: datetime) -> ScalingDecision | None:
    """Act on the plan (replace the lost engines, or apply the choice) and set the policy's `last_*`
    fields (the caller saves them)."""
    state, metrics, interval = plan.state, plan.metrics, plan.interval
    decision: ScalingDecision | None = None
    if plan.choice is None:
        decision = _replace(policy, plan.lost, state, now=now, interval=interval, metrics=metrics)
        target, reason = state.engines + len(plan.lost), decision.reason
    else:
        target, reason = plan.choice.target, plan.choice.reason
        decision = _apply(policy, plan.choice, state, now=now, interval=interval, metrics=metrics)
        if decision is not None:
            reason = decision.reason
    policy.last_evaluated_at = now
    policy.last_target_engines = target
    policy.last_reason = reason
    policy.last_metrics = metrics
    if decision is not None and decision.action != ScalingDecision.Action.BLOCKED:
        policy.quiet_since = None  # a changed pool is quiet anew only from now
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
        victim = _full(pick_for_removal(policy, state) if state.serving else state.starting[-1])
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
    lost = [_full(d) for d in lost]
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
    """Evaluate every due policy; the ids of those that decided. One pool's error spares the others.

    Beat runs it every 2 s, so a tick reads in bulk what the evaluations of its due policies need, in
    one transaction: the policies locked at once, then their decisions, their pools' engines, the
    engines' live records (one MGET) and the templates' baselines, a query each. A policy that holds
    (most of them, most of the time) writes only its `last_*` fields, saved together at the end; one that
    acts does so in a savepoint of its own (its error rolls back only its changes), and the policies
    after it whose pools serve the alias it changed read their engines afresh, as `evaluate` would. The
    others keep the tick's reads: their engines are not the ones it changed (a pool's engines are those
    serving its alias), and a placement reads the hosts afresh anyway. Re-reading every later pool
    after any action made the acting ticks 2-4 times the others at 1,000 hosts.
    """
    now = now or timezone.now()
    due = due_policy_ids(now)
    if not due:
        return []
    decided: list[int] = []
    with transaction.atomic():
        policies = _locked_policies(due)
        bulk = _read_tick(policies, now)
        changed: set[str] = set()  # aliases whose engines a pool changed: their pools read afresh
        held: list[ScalingPolicy] = []
        for policy in policies:
            try:
                history = bulk.history[policy.pk]
                if history.decided_this_interval:
                    continue  # decided already in this interval (a task run twice)
                if policy.pool.alias in changed:
                    with transaction.atomic():  # as `evaluate`, in a savepoint
                        _forget_removed(policy, history.mine)
                        rows = pool_engine_rows(policy.pool, policy.alias_version_id, alias_read=True)  # type: ignore[attr-defined]
                        decision = _carry_out(policy, _plan(policy, now, history, rows), now)
                        policy.save(update_fields=POLICY_FIELDS)
                    changed.update(_aliases_changed(policy))
                    if decision is not None:
                        decided.append(policy.pk)
                    continue
                plan = _plan(policy, now, history, bulk.rows[policy.pk], bulk.live, bulk.baselines[policy.pk])
                if plan.holds and policy.pk not in bulk.to_forget:
                    _carry_out(policy, plan, now)  # no change to make: the last_* fields only
                    held.append(policy)
                    continue
                with transaction.atomic():
                    _forget_removed(policy, history.mine)
                    decision = _carry_out(policy, plan, now)
                    policy.save(update_fields=POLICY_FIELDS)
                changed.update(_aliases_changed(policy))
                if decision is not None:
                    decided.append(policy.pk)
            except Exception:
                log.exception("scaling evaluation of policy %s failed", policy.pk)
        ScalingPolicy.objects.bulk_update(held, POLICY_FIELDS)
    return decided


def _aliases_changed(policy: ScalingPolicy) -> set[str]:
    """The aliases whose engines a policy's action may have changed: its pool's (the engines it drains
    or replaces) and its template's (the copies it adds serve the template's name)."""
    return {policy.pool.alias, policy.template.served_model_name}


@dataclass
class TickReads:
    """What the evaluations of one tick read in bulk, by policy id (live records by key)."""

    history: dict[int, History]
    rows: dict[int, list[Deployment]]
    live: dict[str, dict[str, Any]]
    baselines: dict[int, Any]
    # Policies with stopped engines of their own to delete (`_forget_removed`).
    to_forget: set[int]


def _read_tick(policies: list[ScalingPolicy], now: datetime) -> TickReads:
    """`read_history`, `pool_engine_rows`, the live records and the baselines of these policies, in a
    query each (and one MGET)."""
    intervals = {p.pk: _interval(p, now) for p in policies}
    by_policy: dict[int, list[tuple[int, str, datetime, Any]]] = {p.pk: [] for p in policies}
    decisions = ScalingDecision.objects.filter(
        Q(action__in=CHANGES) | Q(interval__in=set(intervals.values())), policy_id__in=intervals
    ).values_list("policy_id", "interval", "action", "at", "metrics")  # newest first
    for policy_id, *row in decisions:
        by_policy[policy_id].append(tuple(row))
    history = {p.pk: _history(by_policy[p.pk], intervals[p.pk]) for p in policies}

    versions = {p.pk: pool_version_id(p.pool, p.alias_version_id, alias_read=True) for p in policies}  # type: ignore[attr-defined]
    engines = list(
        Deployment.objects.select_related("host")
        .filter(served_model_name__in={p.pool.alias for p in policies}, desired_state=DesiredState.RUNNING)
        .only(*POOL_ROW_FIELDS, "served_model_name", "model_version", "role")
    )  # in the model's order, as pool_deployments
    rows = {
        p.pk: [
            d
            for d in engines
            if d.served_model_name == p.pool.alias
            and (versions[p.pk] is None or d.model_version_id == versions[p.pk])
            and (not p.pool.role or d.role == p.pool.role)
        ]
        for p in policies
    }
    serving = {d.pk for pool_rows in rows.values() for d in pool_rows if d.state == DeploymentState.READY}
    live = read_live_many([live_deployment_key(pk) for pk in sorted(serving)])

    baselines: dict[int, Any] = {p.pk: None for p in policies}
    with_ttft = {p.template_id: p.pk for p in policies if p.target_ttft_ratio is not None}
    for baseline in PerformanceBaseline.objects.filter(deployment_id__in=with_ttft):  # newest first
        for p in policies:
            if p.template_id == baseline.deployment_id and p.target_ttft_ratio is not None:
                baselines[p.pk] = baselines[p.pk] or baseline

    mine = {pk for h in history.values() for pk in h.mine}
    stopped = set(
        Deployment.objects.filter(
            pk__in=mine, desired_state=DesiredState.STOPPED, state=DeploymentState.STOPPED
        ).values_list("pk", flat=True)
    )
    to_forget = {p.pk for p in policies if (history[p.pk].mine - {p.template_id}) & stopped}
    return TickReads(history, rows, live, baselines, to_forget)


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
