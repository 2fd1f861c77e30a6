"""What serves an alias: its versions, each with its configured share, its engines and its live share.

The one answer every console page that shows an alias's serving reads (Aliases, Rollouts, Models, a
version's page) through `GET /api/routing/serving/` (docs/rollouts.md, "What serves an alias"). Pages
used to work it out each on their own from the alias's active version and the rollout row, and so said
"100 % fp16, 1 engine ready" while two AWQ engines in a pool that names its version took most requests.

- Configured: read from the routing snapshot the proxy itself builds
  (`routing.proxy.config.load_routing_snapshot`), so it cannot drift from what the proxy does: the
  pools the alias's requests can reach (its policy's rules in order, the default, else the alias's own
  pool), the version each pool serves (the alias's active one, or the one the pool names) and the
  canary share riding on the pools that serve the active version. When every route ends at one
  version (a canary aside), each version's share is a number; when policy rules send requests to pools
  of different versions, the share depends on the requests (prompt length, task, tenant, priority) and
  is given as the routes, not a number. A pool's fallback and spill carry overflow only: they are named
  in the routes and count for no configured share.
- Engines: the deployments under the alias's served name, by version: ready (what the proxy routes),
  sleeping, and all that should run (desired running, or ready or asleep).
- Live: the request log over the last `minutes` (default SERVING_WINDOW_MINUTES, 15). A row counts
  when a version's engine was sent the request: the proxy sets `model_version_id` only then, so refusals
  (authentication, quotas, rate limits, context checks, no endpoint) and answers from the cache or a
  static endpoint are left out. The request log is written in batches, so the last second or two may be
  missing.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db.models import Count, Q
from django.utils import timezone

from models_registry.models import ModelAlias, ModelVersion
from nodes.choices import DeploymentState, DesiredState
from nodes.models import Deployment
from routing.models import ACTIVE_ROLLOUT_STATES, RequestLog, Rollout, ShadowConfig
from routing.proxy.config import Pool, RoutingSnapshot, Rule, load_routing_snapshot

# The live share's window: long enough to hold a few thousand requests of a busy alias, short enough
# that a change of routing shows within minutes (what an operator checks after changing it).
SERVING_WINDOW_MINUTES = 15
MAX_WINDOW_MINUTES = 24 * 60

# How the configured shares are set.
FIXED = "fixed"  # every route ends at one version (a canary's share aside): each share is a number
RULES = "rules"  # policy rules send requests to pools of different versions: it depends on the requests
UNROUTED = "none"  # no pool routes the alias (no engine, no pool)

# A version's part in the alias, the first that applies.
ACTIVE = "active"  # the alias's active version
CANDIDATE = "candidate"  # the active rollout's candidate
PINNED = "pinned"  # a pool names it (RoutePool.model_version): not the active version, still routed to
SHADOW = "shadow"  # only mirrored to (shadow traffic); it answers no client
IDLE = "idle"  # it has engines under the alias's name, but no route sends them requests
RETIRED = "retired"  # it answered requests in the window but serves the alias no longer
ROLES = (ACTIVE, CANDIDATE, PINNED, SHADOW, IDLE, RETIRED)


@dataclass
class VersionServing:
    """One version's part in serving an alias."""

    version_id: int
    version_label: str
    role: str
    # Percent of the alias's requests its routing sends here (None: it depends on the requests, see
    # `routes`); overflow through a fallback or a spill is not counted.
    configured_share: float | None = 0.0
    # How requests reach it, in words ("pool llama-fast: rule 2 (prompts up to 6000 tokens)").
    routes: list[str] = field(default_factory=list)
    engines_ready: int = 0
    engines_sleeping: int = 0
    engines_total: int = 0
    # Requests its engines were sent in the window, and their percent of the alias's (None: no requests).
    requests: int = 0
    live_share: float | None = None
    # Percent of the alias's requests mirrored to it by shadow traffic (None: none).
    mirrored_percent: float | None = None


@dataclass
class AliasServing:
    """Which versions serve an alias, configured and live, with the totals."""

    alias: int
    alias_name: str
    active_version: int
    active_version_label: str
    configured_mode: str
    rollout: int | None
    rollout_state: str
    rollout_share: float | None
    window_minutes: int
    since: dt.datetime
    until: dt.datetime
    versions: list[VersionServing] = field(default_factory=list)
    engines_ready: int = 0
    engines_sleeping: int = 0
    engines_total: int = 0
    requests: int = 0


@dataclass(frozen=True)
class _Route:
    pool: str
    how: str
    primary: bool  # False: overflow only (fallback, spill)


def _unconditional(rule: Rule) -> bool:
    return (
        rule.tasks is None
        and rule.min_prompt_tokens is None
        and rule.max_prompt_tokens is None
        and rule.tenants is None
        and rule.priority is None
    )


def describe_rule(rule: Rule) -> str:
    """A policy rule's conditions in words."""
    parts: list[str] = []
    if rule.tasks is not None:
        parts.append(f"task {' or '.join(sorted(rule.tasks))}")
    if rule.min_prompt_tokens is not None:
        parts.append(f"prompts from {rule.min_prompt_tokens} tokens")
    if rule.max_prompt_tokens is not None:
        parts.append(f"prompts up to {rule.max_prompt_tokens} tokens")
    if rule.tenants is not None:
        parts.append(f"tenant {' or '.join(sorted(rule.tenants))}")
    if rule.priority is not None:
        parts.append(f"priority {rule.priority}")
    return ", ".join(parts) or "every request"


def _routes(snap: RoutingSnapshot, alias: str) -> list[_Route]:
    """The pools `alias`'s requests can reach, in the order the proxy tries them (`pick_pool` in
    routing.proxy.pipeline.route), then the pools overflow can reach (fallback, spill).

    Rules are numbered from 1, as the Routing page lists them."""
    pools = snap.pools
    policy = snap.policies.get(alias)
    out: list[_Route] = []
    if policy is None:
        if alias in pools:
            out.append(_Route(alias, "the alias's pool", True))
        return out
    exhausted = False
    for n, rule in enumerate(policy.rules, start=1):
        if rule.pool not in pools or (rule.aliases is not None and alias not in rule.aliases):
            continue  # the proxy skips it for this alias
        out.append(_Route(rule.pool, f"rule {n} ({describe_rule(rule)})", True))
        if _unconditional(rule):
            exhausted = True  # no later rule, nor the default, is ever reached
            break
    if not exhausted:
        if policy.default_pool and policy.default_pool in pools:
            out.append(_Route(policy.default_pool, "default", True))
        elif alias in pools:
            out.append(_Route(alias, "the alias's pool (no rule matched)", True))
    if policy.fallback_pool and policy.fallback_pool in pools:
        out.append(_Route(policy.fallback_pool, "fallback when the chosen pool has no free endpoint", False))
    for home, spill in policy.spills.items():
        if spill.pool in pools:
            out.append(_Route(spill.pool, f"spill from {home} while it has headroom", False))
    return out


@dataclass
class _Configured:
    mode: str
    shares: dict[int, float | None]  # the versions routes reach; None: it depends on the requests
    routes: dict[int, list[str]]  # every version a route reaches (overflow included), in words


def configured(snap: RoutingSnapshot, alias: str) -> _Configured:
    """How the proxy's snapshot splits `alias`'s requests between versions."""
    # By version, then by pool (in the order first reached): how requests get there.
    hows: dict[int, dict[str, list[str]]] = {}

    def note(version: int | None, pool: str, how: str) -> None:
        if version is not None:
            hows.setdefault(version, {}).setdefault(pool, []).append(how)

    primary: list[Pool] = []
    for route in _routes(snap, alias):
        pool = snap.pools[route.pool]
        note(pool.version_id, pool.name, route.how)
        if pool.canary is not None:
            note(pool.canary.version_id, pool.name, f"canary {pool.canary.share:g}% of {route.how}")
        if route.primary:
            primary.append(pool)
    words = {
        version: [f"pool {pool}: {', '.join(how)}" for pool, how in by_pool.items()]
        for version, by_pool in hows.items()
    }
    if not primary:
        return _Configured(UNROUTED, {}, words)
    shapes = {
        (p.version_id, p.canary.version_id if p.canary else None, p.canary.share if p.canary else 0.0)
        for p in primary
    }
    shares: dict[int, float | None] = {}
    if len(shapes) > 1:
        for pool in primary:
            if pool.version_id is not None:
                shares[pool.version_id] = None
            if pool.canary is not None and pool.canary.share > 0:
                shares[pool.canary.version_id] = None
        return _Configured(RULES, shares, words)
    version, candidate, share = shapes.pop()
    if version is not None:
        shares[version] = 100.0 - share
    if candidate is not None:
        shares[candidate] = (shares.get(candidate) or 0.0) + share
    return _Configured(FIXED, shares, words)


def _engines(names: list[str]) -> dict[tuple[str, int], tuple[int, int, int]]:
    """(ready, sleeping, total) by (served name, version): total is what should run."""
    should_run = Q(desired_state=DesiredState.RUNNING) | Q(
        state__in=[DeploymentState.READY, DeploymentState.SLEEPING]
    )
    rows = (
        Deployment.objects.filter(should_run, served_model_name__in=names)
        .values("served_model_name", "model_version_id")
        .annotate(
            ready=Count("id", filter=Q(state=DeploymentState.READY)),
            sleeping=Count("id", filter=Q(state=DeploymentState.SLEEPING)),
            total=Count("id"),
        )
    )
    return {
        (r["served_model_name"], r["model_version_id"]): (r["ready"], r["sleeping"], r["total"]) for r in rows
    }


def ready_deployments(names: list[str]) -> dict[tuple[str, int], int]:
    """Ready deployments by (served name, version): the engines the proxy routes."""
    return {key: ready for key, (ready, _, _) in _engines(names).items()}


def live_requests(names: list[str], since: dt.datetime, until: dt.datetime) -> dict[tuple[str, int], int]:
    """Requests sent to a version's engine in [since, until), by (alias, version), from the request log."""
    rows = (
        RequestLog.objects.filter(
            alias__in=names, created_at__gte=since, created_at__lt=until, model_version_id__isnull=False
        )
        .values("alias", "model_version_id")
        .annotate(n=Count("id"))
    )
    return {(r["alias"], r["model_version_id"]): r["n"] for r in rows}


def _role(
    vid: int,
    alias: ModelAlias,
    rollout: Rollout | None,
    shadow: ShadowConfig | None,
    conf: _Configured,
    total: int,
) -> str:
    if vid == alias.active_version_id:
        return ACTIVE
    if rollout is not None and vid == rollout.candidate_version_id:
        return CANDIDATE
    if vid in conf.routes:
        return PINNED
    if shadow is not None and vid == shadow.candidate_version_id:
        return SHADOW
    return IDLE if total else RETIRED


def alias_serving(
    names: Iterable[str] | None = None,
    *,
    minutes: int = SERVING_WINDOW_MINUTES,
    now: dt.datetime | None = None,
) -> list[AliasServing]:
    """What serves each alias (every one, or those named), in name order."""
    until = now or timezone.now()
    since = until - dt.timedelta(minutes=minutes)
    aliases = ModelAlias.objects.select_related("active_version__model").order_by("name")
    if names is not None:
        aliases = aliases.filter(name__in=list(names))
    rows = list(aliases)
    if not rows:
        return []
    alias_names = [a.name for a in rows]
    snap = load_routing_snapshot()
    rollouts = {
        r.alias_id: r
        for r in Rollout.objects.filter(alias__in=rows, state__in=ACTIVE_ROLLOUT_STATES).select_related(
            "candidate_version__model"
        )
    }
    shadows = {
        s.alias_id: s
        for s in ShadowConfig.objects.filter(alias__in=rows, enabled=True, percent__gt=0).select_related(
            "candidate_version__model"
        )
    }
    engines = _engines(alias_names)
    live = live_requests(alias_names, since, until)
    labels = _labels(rows, snap, rollouts.values(), shadows.values(), {v for _, v in [*engines, *live]})
    out: list[AliasServing] = []
    for alias in rows:
        rollout = rollouts.get(alias.pk)
        shadow = shadows.get(alias.pk)
        conf = configured(snap, alias.name)
        ids = {alias.active_version_id, *conf.shares, *conf.routes}
        ids |= {v for (name, v) in [*engines, *live] if name == alias.name}
        ids |= {x.candidate_version_id for x in (rollout, shadow) if x is not None}
        total_requests = sum(n for (name, _), n in live.items() if name == alias.name)
        versions: list[VersionServing] = []
        for vid in ids:
            ready, sleeping, total = engines.get((alias.name, vid), (0, 0, 0))
            requests = live.get((alias.name, vid), 0)
            versions.append(
                VersionServing(
                    version_id=vid,
                    version_label=labels.get(vid, f"version #{vid}"),
                    role=_role(vid, alias, rollout, shadow, conf, total),
                    configured_share=conf.shares.get(vid, 0.0),
                    routes=conf.routes.get(vid, []),
                    engines_ready=ready,
                    engines_sleeping=sleeping,
                    engines_total=total,
                    requests=requests,
                    live_share=100.0 * requests / total_requests if total_requests else None,
                    mirrored_percent=float(shadow.percent)
                    if shadow is not None and vid == shadow.candidate_version_id
                    else None,
                )
            )
        versions.sort(key=_order)
        out.append(
            AliasServing(
                alias=alias.pk,
                alias_name=alias.name,
                active_version=alias.active_version_id,
                active_version_label=str(alias.active_version),
                configured_mode=conf.mode,
                rollout=rollout.pk if rollout else None,
                rollout_state=rollout.state if rollout else "",
                rollout_share=float(rollout.share) if rollout else None,
                window_minutes=minutes,
                since=since,
                until=until,
                versions=versions,
                engines_ready=sum(v.engines_ready for v in versions),
                engines_sleeping=sum(v.engines_sleeping for v in versions),
                engines_total=sum(v.engines_total for v in versions),
                requests=total_requests,
            )
        )
    return out


def serving_of(
    name: str, *, minutes: int = SERVING_WINDOW_MINUTES, now: dt.datetime | None = None
) -> AliasServing | None:
    """What serves one alias; None when there is no such alias."""
    found = alias_serving([name], minutes=minutes, now=now)
    return found[0] if found else None


def _order(v: VersionServing) -> tuple[int, float, float, str]:
    """By role (the active version first), then configured share, live share and label."""
    return (
        ROLES.index(v.role),
        -(v.configured_share if v.configured_share is not None else 50.0),
        -(v.live_share or 0.0),
        v.version_label,
    )


def _labels(
    aliases: list[ModelAlias],
    snap: RoutingSnapshot,
    rollouts: Iterable[Rollout],
    shadows: Iterable[ShadowConfig],
    seen: set[int],
) -> dict[int, str]:
    """The label ("model@revision") of every version named; one query for those the rows do not name."""
    labels = {a.active_version_id: str(a.active_version) for a in aliases}
    labels.update((r.candidate_version_id, str(r.candidate_version)) for r in rollouts)
    labels.update((s.candidate_version_id, str(s.candidate_version)) for s in shadows)
    labels.update(snap.version_labels)
    for pool in snap.pools.values():
        if pool.version_id is not None and pool.version_label:
            labels.setdefault(pool.version_id, pool.version_label)
    missing = seen - set(labels)
    if missing:
        labels.update(
            (v.pk, str(v)) for v in ModelVersion.objects.select_related("model").filter(pk__in=missing)
        )
    return labels
