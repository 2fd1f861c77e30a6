"""The deployment state machine and host reachability, shared by the API, beat and the agent.

- `engine_api_key`: the per-deployment engine key (derived, never stored), for the agent and the proxy.
- `transition`: the one place a deployment's state changes (history row, config-change pub/sub,
  live push to the browser).
- live values in Redis (what the agent last saw), and pushes to browser groups.
- host reachability from heartbeats, and the unreachable sweep beat runs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from datetime import timedelta
from typing import Any

import orjson
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction
from django.db.models import Case, Q, Value, When
from django.utils import timezone

from core.live import FLEET_GROUP, deployment_group, group_key, host_group, push_live_events
from core.redis_client import get_redis, key, publish_config_change
from nodes import agent_generation
from nodes.choices import DeploymentState, HostState
from nodes.models import Deployment, DeploymentEvent, Host

log = logging.getLogger(__name__)


# --- the engine API key -------------------------------------------------------------------------


def engine_api_key(deployment: Deployment) -> str:
    """The key this deployment's engine accepts on /v1; the proxy computes the same value.

    HMAC of the deployment id and its current start token, so it changes at every launch and a
    client that learned an old one (or the engine port) cannot bypass the proxy for long.
    """
    return engine_key_for(deployment.pk, deployment.start_token)


def engine_key_for(deployment_id: int, start_token: str) -> str:
    """engine_api_key from the two values it depends on (for readers of rows, not model instances)."""
    message = f"engine:{deployment_id}:{start_token}".encode()
    return hmac.new(settings.API_KEY_HMAC_SECRET.encode(), message, hashlib.sha256).hexdigest()


# --- live values in Redis -----------------------------------------------------------------------


def live_deployment_key(deployment_id: int) -> str:
    return key("live", "deployment", str(deployment_id))


def live_gpu_key(host_name: str, index: int) -> str:
    return key("live", "gpu", host_name, str(index))


def read_live(redis_key: str) -> dict[str, Any] | None:
    """A live JSON value from Redis, or None when absent, expired or Redis is down."""
    try:
        raw = get_redis().get(redis_key)
    except Exception:  # redis errors must never break a page that only decorates with live data
        return None
    return None if raw is None else _live_value(raw)


def read_live_many(redis_keys: list[str]) -> dict[str, dict[str, Any]]:
    """Several live values in one round trip (MGET); absent, expired or unreadable ones are left out."""
    if not redis_keys:
        return {}
    try:
        raws = get_redis().mget(redis_keys)
    except Exception:  # see read_live
        return {}
    out: dict[str, dict[str, Any]] = {}
    for redis_key, raw in zip(redis_keys, raws, strict=True):
        value = None if raw is None else _live_value(raw)
        if value is not None:
            out[redis_key] = value
    return out


def _live_value(raw: bytes | str) -> dict[str, Any] | None:
    """A live record (a JSON object), or None when it is not one."""
    try:
        value = orjson.loads(raw)  # a fleet summary reads thousands: json.loads was most of its time
    except orjson.JSONDecodeError:
        try:  # what orjson refuses and json takes (NaN, from a writer using json.dumps)
            value = json.loads(raw)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


SERVING_STATES = frozenset({DeploymentState.READY, DeploymentState.DEGRADED})

# --- wake requests ------------------------------------------------------------------------------
#
# A sleeping engine is woken by its host's agent only (the dev endpoints carry no key of their own).
# Whoever wants it awake (the proxy holding a request, the API) sets its wake key; the agent's
# supervisor reads the keys of its sleeping engines every tick and wakes those that have one. The key
# expires by itself, so a request nobody waits for any more does not wake an engine much later.
WAKE_REQUEST_TTL_SECONDS = 120


def wake_request_key(deployment_id: int) -> str:
    return key("wake", "deployment", str(deployment_id))


def request_wake(deployment_id: int) -> None:
    try:
        get_redis().set(wake_request_key(deployment_id), str(time.time()), ex=WAKE_REQUEST_TTL_SECONDS)
    except Exception as exc:  # the API also queues a task; the proxy retries while it holds a request
        log.warning("could not ask for a wake of deployment %s: %s", deployment_id, exc)


def wake_requested(deployment_ids: list[int]) -> set[int]:
    """Which of these deployments someone asked to wake (one MGET; Redis down = none)."""
    if not deployment_ids:
        return set()
    try:
        values = get_redis().mget([wake_request_key(i) for i in deployment_ids])
    except Exception:
        return set()
    return {i for i, v in zip(deployment_ids, values, strict=True) if v is not None}


def clear_wake_request(deployment_id: int) -> None:
    try:
        get_redis().delete(wake_request_key(deployment_id))
    except Exception as exc:  # it expires by its TTL
        log.warning("could not clear the wake request of deployment %s: %s", deployment_id, exc)


def _forget_live(deployment_id: int) -> None:
    try:
        get_redis().delete(live_deployment_key(deployment_id))
    except Exception as exc:  # it expires by its TTL anyway
        log.warning("could not drop live state of deployment %s: %s", deployment_id, exc)


def push_event(groups: list[str], event: dict[str, Any]) -> None:
    """Push one event to browser groups; a Channels/Redis hiccup is logged, never raised."""
    push_events([(group, event) for group in groups])


def push_events(sends: list[tuple[str, dict[str, Any]]]) -> None:
    """Push many (group, event) pairs in one go (core.live.push_live_events); failures are logged."""
    try:
        failed = push_live_events(sends)
    except Exception as exc:  # the live feed is best-effort; the database stays the truth
        log.warning("live push failed: %s", exc)
        return
    for group, error in failed:
        log.warning("live push to %s failed: %s", group, error)


def push_events_to_listeners(sends: list[tuple[str, dict[str, Any]]]) -> None:
    """`push_events`, leaving out the groups nobody is in: one EXISTS round trip for all of them first.

    A send to a group without members delivers nothing, yet costs the channel layer two round trips;
    a sweep pushes to a group per engine (its page), which is rarely open. When the layer keeps no
    member sets or Redis does not answer, every event is pushed.
    """
    groups = list(dict.fromkeys(group for group, _ in sends))
    keys = [k for k in (group_key(group) for group in groups) if k is not None]
    if not groups or len(keys) < len(groups):
        push_events(sends)
        return
    try:
        pipe = get_redis().pipeline(transaction=False)
        for member_set in keys:
            pipe.exists(member_set)
        found = pipe.execute()
    except Exception:  # the check is an optimisation only
        push_events(sends)
        return
    listened = {group for group, n in zip(groups, found, strict=True) if n}
    sends = [(group, event) for group, event in sends if group in listened]
    if not sends:
        return
    try:
        failed = async_to_sync(_send_in_order)(sends)
    except Exception as exc:  # the live feed is best-effort; the database stays the truth
        log.warning("live push failed: %s", exc)
        return
    for group, error in failed:
        log.warning("live push to %s failed: %s", group, error)


async def _send_in_order(sends: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, BaseException]]:
    """core.live.send_live_events one after the other: many events to one group (the fleet's, after a
    sweep) arrive in order, and take less than half the time of as many concurrent sends, which each
    hold a connection of their own."""
    layer = get_channel_layer()
    failed: list[tuple[str, BaseException]] = []
    for group, event in sends:
        try:
            await layer.group_send(group, {"type": "live.event", "event": event})
        except Exception as exc:
            failed.append((group, exc))
    return failed


# --- state transitions --------------------------------------------------------------------------


def transition(
    deployment: Deployment,
    to_state: str,
    message: str = "",
    *,
    log_tail: str = "",
    launch: dict[str, Any] | None = None,
    **fields: Any,
) -> Deployment:
    """Move `deployment` to `to_state` (with extra field updates), record it and tell everyone.

    Writes a DeploymentEvent (with the launch record when `launch` is given), publishes a config
    change so proxies refresh their endpoints, and pushes the new state to the fleet, host and
    deployment live groups after commit.
    """
    with transaction.atomic():
        locked = Deployment.objects.select_for_update().select_related("host").get(pk=deployment.pk)
        from_state = locked.state
        changed = from_state != to_state
        locked.state = to_state
        if changed:
            locked.state_changed_at = timezone.now()
        if message or changed:
            locked.state_reason = message
        if log_tail:
            locked.last_log_lines = log_tail
        for name, value in fields.items():
            setattr(locked, name, value)
        locked.save()
        if changed or log_tail or message or launch:
            DeploymentEvent.objects.create(
                deployment=locked,
                from_state=from_state,
                to_state=to_state,
                message=message,
                log_tail=log_tail,
                launch=launch,
            )
        if changed:
            publish_config_change("deployment", id=locked.pk, state=to_state)
            event = {
                "type": "deployment.state",
                "deployment_id": locked.pk,
                "host": locked.host.name,
                "state": to_state,
                "from_state": from_state,
                "reason": message,
                "ts": time.time(),
            }
            groups = [FLEET_GROUP, host_group(locked.host.name), deployment_group(locked.pk)]
            transaction.on_commit(lambda: push_event(groups, event))
            if to_state not in SERVING_STATES:
                # Live numbers of an engine that no longer serves must not outlive it by their TTL.
                transaction.on_commit(lambda: _forget_live(locked.pk))
    for name in ("state", "state_changed_at", "state_reason", "last_log_lines", *fields):
        setattr(deployment, name, getattr(locked, name))
    return deployment


def record_event(deployment: Deployment, message: str, *, log_tail: str = "") -> None:
    """A history entry that is not a state change (an action, a refusal, a probe note)."""
    DeploymentEvent.objects.create(
        deployment=deployment,
        from_state=deployment.state,
        to_state=deployment.state,
        message=message,
        log_tail=log_tail,
    )


# --- host reachability --------------------------------------------------------------------------


def host_is_reachable(host: Host) -> bool:
    """Fresh heartbeat and not marked unreachable; computed from the timestamp, not a stale flag."""
    if host.last_heartbeat is None or host.state == HostState.UNREACHABLE:
        return False
    age = (timezone.now() - host.last_heartbeat).total_seconds()
    return age <= settings.NODE_UNREACHABLE_SECONDS


def mark_unreachable_hosts() -> list[str]:
    """Mark hosts whose last heartbeat is older than NODE_UNREACHABLE_SECONDS; returns their names.

    Their ready engines become degraded (the proxy stops preferring them); the agent puts them back
    once heartbeats resume and its probes pass.

    Beat runs it every 2 s over the whole fleet, so a sweep is a fixed number of queries however many
    hosts went silent: the hosts and then their engines are locked and updated in one statement each,
    the engines' history rows written in one insert, and the browser pushes sent in one hop after the
    commit. What each engine goes through is `transition`'s (history row, config change, live push).
    """
    cutoff = timezone.now() - timedelta(seconds=settings.NODE_UNREACHABLE_SECONDS)
    stale = Host.objects.filter(
        Q(last_heartbeat__lt=cutoff), ~Q(state__in=[HostState.UNREACHABLE, HostState.UNKNOWN])
    )
    if not stale.exists():
        return []  # the usual tick: one read
    with transaction.atomic():
        # Locked, so that a heartbeat arriving now waits for this commit and then brings its host back.
        hosts = list(stale.select_for_update(of=("self",)).values_list("pk", "name", "last_heartbeat"))
        if not hosts:
            return []
        Host.objects.filter(pk__in=[pk for pk, _, _ in hosts]).update(state=HostState.UNREACHABLE)
        names = [name for _, name, _ in hosts]
        # Their agents' next syncs must be full ones (which bring the hosts back): no routine answer.
        agent_generation.bump(names)
        for name in names:
            publish_config_change("host", name=name, state=HostState.UNREACHABLE)
        engine_sends = _degrade_engines_of(hosts)
        sends: list[tuple[str, dict[str, Any]]] = []
        now = time.time()
        for pk, name, _ in hosts:
            event = {"type": "host.state", "host": name, "state": HostState.UNREACHABLE, "ts": now}
            sends += [*engine_sends.get(pk, []), (FLEET_GROUP, event), (host_group(name), event)]
        transaction.on_commit(lambda: push_events_to_listeners(sends))
    return names


def _degrade_engines_of(hosts: list[tuple[int, str, Any]]) -> dict[int, list[tuple[str, dict[str, Any]]]]:
    """`transition` to degraded of the ready and starting engines of these (pk, name, last heartbeat) hosts,
    in bulk; returns the live pushes to send after the commit, by host id."""
    reasons = {
        pk: f"Host {name} missed heartbeats (last {seen.isoformat() if seen else 'never'}); "
        "engine state unknown."
        for pk, name, seen in hosts
    }
    name_of = {pk: name for pk, name, _ in hosts}
    engines = list(
        Deployment.objects.select_for_update(of=("self",))
        .filter(host_id__in=reasons, state__in=[DeploymentState.READY, DeploymentState.STARTING])
        .order_by("host__name", "port")
        .values_list("pk", "host_id", "state")
    )
    if not engines:
        return {}
    to_state = DeploymentState.DEGRADED
    changed_at = timezone.now()
    Deployment.objects.filter(pk__in=[pk for pk, _, _ in engines]).update(
        state=to_state,
        state_changed_at=changed_at,
        state_reason=Case(*(When(host_id=pk, then=Value(text)) for pk, text in reasons.items())),
        updated_at=changed_at,
    )
    DeploymentEvent.objects.bulk_create(
        DeploymentEvent(deployment_id=pk, from_state=state, to_state=to_state, message=reasons[host_id])
        for pk, host_id, state in engines
    )
    sends: dict[int, list[tuple[str, dict[str, Any]]]] = {}
    now = time.time()
    for pk, host_id, from_state in engines:
        publish_config_change("deployment", id=pk, state=to_state)
        host_name = name_of[host_id]
        event = {
            "type": "deployment.state",
            "deployment_id": pk,
            "host": host_name,
            "state": to_state,
            "from_state": from_state,
            "reason": reasons[host_id],
            "ts": now,
        }
        groups = (FLEET_GROUP, host_group(host_name), deployment_group(pk))
        sends.setdefault(host_id, []).extend((group, event) for group in groups)
    return sends
