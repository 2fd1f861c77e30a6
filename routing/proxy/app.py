"""The `/v1/` data plane: a lean ASGI app (no Django middleware, no ORM on the hot path).

This module is the process around the request pipeline: it builds the long-lived services
(routing/proxy/services.py: key cache, routing snapshot, live state, leases, request-log writer), runs
their background loops (config subscription, live polling, lease renewal, the periodic refresh), and
dispatches each ASGI request. An inference request goes through routing/proxy/pipeline/ (authenticate ->
read -> count -> pre-stages -> route -> admit -> call and relay -> post-stages -> account).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import redis.asyncio as aioredis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from core.metrics_access import REFUSAL as METRICS_REFUSAL
from core.metrics_access import metrics_allowed
from core.redis_client import CONFIG_CHANNEL, async_redis
from core.redis_client import key as rkey
from routing.proxy import health, pipeline
from routing.proxy import metrics as m
from routing.proxy.config import (
    Endpoint,
    KeyInfo,
    Policy,
    Pool,
    RoutingSnapshot,
    RoutingSource,
    build_routing_snapshot,
    load_deployments,
    load_routing_source,
    patch_deployments,
)
from routing.proxy.errors import ProxyError, not_found
from routing.proxy.health import EndpointState
from routing.proxy.limits import Limiter
from routing.proxy.pipeline import authenticate as auth_step
from routing.proxy.pipeline import route as route_step
from routing.proxy.pipeline.context import (
    DisconnectWatch,
    Receive,
    RequestContext,
    RetryableUpstreamError,
    Scope,
    Send,
    header,
)
from routing.proxy.pipeline.read import SUPPORTED_ENDPOINTS, unsupported_endpoint
from routing.proxy.pipeline.respond import JSON_HEADERS, send_error, send_raw
from routing.proxy.pipeline.route import context_length_error
from routing.proxy.predict import PREDICTIONS_PUBLISH_S, PREDICTIONS_TTL_S
from routing.proxy.requestlog import RequestLogWriter
from routing.proxy.scorers import seed_random
from routing.proxy.services import LIVE_POLL_S, Services
from routing.proxy.shadow import pair_writer
from routing.services import maintain_request_log

__all__ = [
    "KINDS",
    "SUPPORTED_ENDPOINTS",
    "DisconnectWatch",
    "Proxy",
    "RequestContext",
    "RetryableUpstreamError",
    "build_proxy_app",
    "context_length_error",
    "unsupported_endpoint",
]

log = logging.getLogger(__name__)

# A config change reloads the routing snapshot after this window, which coalesces a burst into one load:
# 50 ms, or ten times the last load's duration, capped (Proxy.reload_window, docs/proxy.md).
RELOAD_WINDOW_MIN_S = 0.05
RELOAD_WINDOW_MAX_S = 5.0

KINDS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/embeddings": "embedding",
}


def apply_settings() -> None:
    """Check the proxy's settings and apply those kept at module level; raises ImproperlyConfigured."""
    if settings.PROXY_LIMITS_ON_REDIS_DOWN != "reject":
        # Fail at start rather than run with a limits mode nobody implemented.
        raise ImproperlyConfigured(
            f"PROXY_LIMITS_ON_REDIS_DOWN={settings.PROXY_LIMITS_ON_REDIS_DOWN!r}: only 'reject' exists"
        )
    if settings.PROXY_LIVE_STALE_SECONDS <= 0:
        raise ImproperlyConfigured(
            f"PROXY_LIVE_STALE_SECONDS={settings.PROXY_LIVE_STALE_SECONDS!r}: use seconds above 0"
        )
    health.STALE_AFTER_S = settings.PROXY_LIVE_STALE_SECONDS
    if settings.PROXY_RANDOM_SEED:
        try:
            seed_random(int(settings.PROXY_RANDOM_SEED))
        except ValueError:
            raise ImproperlyConfigured(
                f"PROXY_RANDOM_SEED={settings.PROXY_RANDOM_SEED!r}: use an integer, or leave it empty"
            ) from None


class Coalesced:
    """`job` run soon after a request, at the pace its `window()` allows: a token bucket that holds
    `burst` runs and earns one back per window. A request waits `settle` seconds (the rest of its burst
    shares that run), then runs at once if a run is in the bucket, or when the next one is earned; every
    request made meanwhile shares it. A request made while the job runs gets a run of its own after it.

    Why a bucket rather than a delay of `window()` after every first request: the window grows with what
    a load costs (ten times it), so one slow load (a cold start, a busy machine) would hold back the next
    lone admin change by that much, and a switch or a canary step must reach every proxy within a second
    (docs/rollouts.md). A lone change is never held back; a steady burst still runs at most `burst`
    loads and then one per window, a tenth of a core."""

    def __init__(
        self,
        window: Callable[[], float],
        job: Callable[[], Awaitable[None]],
        what: str,
        settle: float = RELOAD_WINDOW_MIN_S,
        burst: int = 2,
    ) -> None:
        self.window = window
        self.job = job
        self.what = what
        self.settle = settle
        self.burst = burst
        self.pending = False
        self.tokens = float(burst)
        self.earned_at: float | None = None  # loop time the bucket was last topped up

    def request(self) -> None:
        if self.pending:
            return
        self.pending = True
        asyncio.get_running_loop().create_task(self._later())

    def _top_up(self, now: float) -> None:
        if self.earned_at is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.earned_at) / self.window())
        self.earned_at = now

    async def _later(self) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(self.settle)
        self._top_up(loop.time())
        if self.tokens < 1:
            await asyncio.sleep((1 - self.tokens) * self.window())
            self._top_up(loop.time())
        self.tokens = max(0.0, self.tokens - 1)
        self.pending = False
        try:
            await self.job()
        except Exception:
            log.exception("proxy: %s failed", self.what)


class Proxy:
    """The proxy's state for one process (one event loop) and its ASGI entry point."""

    def __init__(self) -> None:
        self.db = ThreadPoolExecutor(max_workers=2, thread_name_prefix="proxy-db")
        self.services = Services(self._in_db)
        self.redis: aioredis.Redis | None = None
        self.pairs: RequestLogWriter | None = None
        self._tasks: list[asyncio.Task[None]] = []
        # A burst of changes shares reloads, paced by Proxy.reload_window (Coalesced).
        self._reloads = Coalesced(self.reload_window, self.reload_snapshot, "config reload")
        # The last few loads' durations: the least of them sets the coalescing window, so one slow load
        # (the cold first one, a busy moment) does not widen it; a big fleet's loads are all slow.
        self.load_costs: deque[float] = deque(maxlen=3)
        self.reloads = 0
        # What the snapshot was built from, so one deployment's change rebuilds its alias only
        # (config.RoutingSource); None until the first load.
        self.source: RoutingSource | None = None
        # Deployments (by id, and all those of a host, by name) whose change waits for the next patch.
        self._patch_ids: set[int] = set()
        self._patch_hosts: set[str] = set()
        # A short fixed window: a patch costs one small query, whatever the fleet's size.
        self._patches = Coalesced(lambda: RELOAD_WINDOW_MIN_S, self.patch_snapshot, "snapshot patch")
        self.patches = 0
        self.patch_seconds = 0.0  # how long the last patch took, its database read included
        # Loads and patches one at a time, each reading the database after the one before it applied:
        # a patch can never be overwritten by an older full load, nor the other way round.
        self._snapshot_lock = asyncio.Lock()

    # The services by their former attribute names (tests and benchmarks reach them so).

    @property
    def snapshot(self) -> RoutingSnapshot:
        return self.services.snapshot

    @snapshot.setter
    def snapshot(self, snap: RoutingSnapshot) -> None:
        self.services.snapshot = snap

    @property
    def pubsub_healthy(self) -> bool:
        return self.services.keys.subscribed

    @pubsub_healthy.setter
    def pubsub_healthy(self, value: bool) -> None:
        self.services.keys.subscribed = value

    @property
    def states(self) -> dict[str, EndpointState]:
        return self.services.live.states

    @property
    def limiter(self) -> Limiter | None:
        return self.services.limiter

    @property
    def reqlog(self) -> RequestLogWriter | None:
        return self.services.reqlog

    # ---- lifecycle -------------------------------------------------------------------------------

    async def startup(self) -> None:
        apply_settings()
        loop = asyncio.get_running_loop()
        svc = self.services
        self.attach_redis(async_redis(settings.REDIS_URL, socket_timeout=1.0, socket_connect_timeout=1.0))
        svc.reqlog = RequestLogWriter(settings.REQUEST_LOG_SPOOL_DIR)
        svc.reqlog.start(maintain=maintain_request_log)
        self.pairs = pair_writer(settings.REQUEST_LOG_SPOOL_DIR / "shadow_pairs")
        self.pairs.start()
        svc.shadow.writer = self.pairs
        try:
            await self.reload_snapshot()
        except Exception:
            log.exception("proxy: initial config load failed; retrying in the background")
        for coro in (
            self._listen_config(),
            self._poll_live(),
            self._renew_leases(),
            self._refresh_loop(),
            self._publish_predictions(),
        ):
            self._tasks.append(loop.create_task(coro))
        # Everything loaded so far (Django, the ORM, the snapshot) lives as long as the process: moving it
        # out of the collector's reach keeps full collections short, and with them the latency tail.
        gc.collect()
        gc.freeze()

    def attach_redis(self, client: aioredis.Redis) -> None:
        """Use `client` for limits and the shared key records (startup does this; tests may too)."""
        self.redis = client
        self.services.redis = client
        self.services.limiter = Limiter(
            client, lease_ms=settings.PROXY_LEASE_MS, allowance_ms=settings.PROXY_LIMIT_ALLOWANCE_MS
        )
        self.services.keys.attach(client)

    async def shutdown(self) -> None:
        svc = self.services
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await svc.shadow.close()
        if svc.reqlog is not None:
            await svc.reqlog.close()
        if self.pairs is not None:
            await self.pairs.close()
        svc.upstream.close()
        if svc.limiter is not None:
            await svc.limiter.aclose()
        if self.redis is not None:
            await self.redis.aclose()
        self.db.shutdown(wait=False)

    async def _in_db(self, fn: Callable[..., Any], *args: Any) -> Any:
        def run() -> Any:
            close_old_connections()
            return fn(*args)

        return await asyncio.get_running_loop().run_in_executor(self.db, run)

    async def reload_snapshot(self) -> None:
        async with self._snapshot_lock:
            began = time.perf_counter()

            def load() -> tuple[RoutingSource, RoutingSnapshot]:
                src = load_routing_source()
                return src, build_routing_snapshot(src)

            src, snap = await self._in_db(load)
            self._apply(snap)
            self.source = src
            self.load_costs.append(time.perf_counter() - began)
            self.reloads += 1

    async def patch_snapshot(self) -> None:
        """Apply the deployments' changes waiting since the last patch: reread those deployments and
        rebuild their aliases' pools (config.patch_deployments); a full load before the first one."""
        async with self._snapshot_lock:
            ids, hosts = self._patch_ids, self._patch_hosts
            self._patch_ids, self._patch_hosts = set(), set()
            if not ids and not hosts:
                return
            began = time.perf_counter()
            try:
                asked, rows = await self._in_db(load_deployments, ids, hosts)
            except Exception:
                # The database is away: keep them for the next patch (or the periodic full reload).
                self._patch_ids |= ids
                self._patch_hosts |= hosts
                raise
            if self.source is None:  # no full load has succeeded yet: it reads them anyway
                self._schedule_reload()
                return
            try:
                snap = patch_deployments(self.source, self.services.snapshot, asked, rows)
            except Exception:
                # The kept source may be half-changed: rebuild everything from the database.
                self.source = None
                log.exception("proxy: snapshot patch failed; reloading it whole")
                self._schedule_reload()
                return
            self._apply(snap)
            self.patch_seconds = time.perf_counter() - began
            self.patches += 1

    def _apply(self, snap: RoutingSnapshot) -> None:
        self.services.live.track(snap)
        self.services.snapshot = snap

    @property
    def reload_seconds(self) -> float:
        """How long the last snapshot load took (0 before the first)."""
        return self.load_costs[-1] if self.load_costs else 0.0

    def reload_window(self) -> float:
        """How long a change waits for others to share its reload: 50 ms, or ten times what a load costs
        (the least of the last three), at most RELOAD_WINDOW_MAX_S. A big fleet's snapshot (thousands of
        deployments) costs a tenth of a second to load, and its agents report state changes many times a
        second: without this, every proxy process would spend its whole core reloading (docs/proxy.md,
        "Config changes"). `Coalesced` paces reloads by it with a token bucket, so a lone change is not
        held back by it.
        """
        cost = min(self.load_costs, default=0.0)
        return min(RELOAD_WINDOW_MAX_S, max(RELOAD_WINDOW_MIN_S, 10 * cost))

    def _schedule_reload(self) -> None:
        self._reloads.request()

    def _schedule_patch(self, deployment_id: int | None = None, host: str | None = None) -> None:
        if deployment_id is not None:
            self._patch_ids.add(deployment_id)
        if host is not None:
            self._patch_hosts.add(host)
        self._patches.request()

    def drop_keys(
        self, *, key_id: int | None = None, digest: str | None = None, tenant_id: int | None = None
    ) -> None:
        self.services.keys.drop(key_id=key_id, digest=digest, tenant_id=tenant_id)

    def clear_keys(self) -> None:
        self.services.keys.clear()

    def handle_config_message(self, data: bytes | str) -> None:
        try:
            msg = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        kind = msg.get("kind")
        if kind == "api_key":
            self.drop_keys(key_id=msg.get("id"), digest=msg.get("hashed_key"))
        elif kind in ("tenant", "quota"):
            if msg.get("id") is None and msg.get("tenant_id") is None:
                self.clear_keys()
            else:
                self.drop_keys(tenant_id=msg.get("tenant_id", msg.get("id")), key_id=msg.get("api_key_id"))
        elif kind == "deployment" and isinstance(msg.get("id"), int):
            self._schedule_patch(deployment_id=msg["id"])  # a state change, the fleet's common change
        elif kind == "host" and isinstance(msg.get("name"), str):
            self._schedule_patch(host=msg["name"])  # its deployments (its address is in their URLs)
        else:
            self._schedule_reload()

    async def _listen_config(self) -> None:
        """Follow config changes; on every (re)subscribe drop caches, since messages may have been missed."""
        backoff = 0.1
        while True:
            client = aioredis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1.0)
            pubsub = client.pubsub()
            try:
                await pubsub.subscribe(rkey(CONFIG_CHANNEL))
                self.pubsub_healthy = True
                self.clear_keys()
                self._schedule_reload()
                backoff = 0.1
                while True:
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5.0)
                    if msg is not None and msg.get("type") == "message":
                        self.handle_config_message(msg["data"])
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self.pubsub_healthy:
                    log.warning("proxy: config subscription lost (%s); keys revalidate every second", exc)
                self.pubsub_healthy = False
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
                    await client.aclose()

    async def _refresh_loop(self) -> None:
        """The safety net behind pub/sub: reload routing and revalidate cached keys periodically."""
        while True:
            await asyncio.sleep(settings.PROXY_CONFIG_REFRESH_SECONDS)
            try:
                await self.reload_snapshot()
                await self.services.keys.revalidate()
            except Exception:
                log.exception("proxy: periodic refresh failed")

    async def _poll_live(self) -> None:
        """Engine live state (KV cache, queue) from Redis, for every fleet endpoint, a few times a second."""
        assert self.redis is not None
        while True:
            await asyncio.sleep(LIVE_POLL_S)
            await self.services.live.poll(self.redis, self.services.snapshot)

    async def _publish_predictions(self) -> None:
        """This process's latency predictors' report (routing/proxy/predict.py) to Redis, for the
        console's routing page; each process under its own key, gone PREDICTIONS_TTL_S after it stops."""
        assert self.redis is not None
        svc = self.services
        name = rkey("predict", svc.id_prefix)
        while True:
            await asyncio.sleep(PREDICTIONS_PUBLISH_S)
            report = svc.predictors.report()
            if report:
                with contextlib.suppress(Exception):
                    await self.redis.set(name, orjson.dumps(report), px=int(PREDICTIONS_TTL_S * 1000))

    async def _renew_leases(self) -> None:
        limiter = self.services.limiter
        assert limiter is not None
        while True:
            await asyncio.sleep(settings.PROXY_LEASE_MS / 3000)
            await self.services.leases.renew(limiter)

    # ---- ASGI ------------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope["path"]
        kind = KINDS.get(path)
        if kind is not None:
            if scope["method"] != "POST":
                await self._send_error(send, ProxyError(405, "Use POST.", code="method_not_allowed"))
                return
            await pipeline.handle(self.services, scope, receive, send, kind)
        elif path == "/v1/models" or path.startswith("/v1/models/"):
            await self.handle_models(scope, send)
        elif path in ("/metrics", "/v1/metrics"):
            if not metrics_allowed(header(scope, b"authorization")):
                await self._send_error(
                    send,
                    ProxyError(
                        401, METRICS_REFUSAL, type="authentication_error", code="invalid_metrics_token"
                    ),
                )
                return
            body = generate_latest(m.REGISTRY)
            await self._send_raw(send, 200, body, [(b"content-type", CONTENT_TYPE_LATEST.encode())])
        elif path in ("/healthz", "/v1/healthz"):
            # Whether config changes arrive live: without it keys are re-read every second (see docs).
            body = b'{"status":"ok","config_subscribed":%s}' % (b"true" if self.pubsub_healthy else b"false")
            await self._send_raw(send, 200, body, JSON_HEADERS)
        else:
            await self._send_error(send, unsupported_endpoint(scope["method"], path))

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _send_raw(
        self, send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
    ) -> None:
        await send_raw(send, status, body, headers)

    async def _send_error(self, send: Send, err: ProxyError, request_id: str | None = None) -> None:
        await send_error(send, err, request_id)

    # ---- auth ------------------------------------------------------------------------------------

    async def authenticate(self, scope: Scope) -> KeyInfo:
        return await auth_step.authenticate(scope, self.services.keys)

    async def shared_key_lookup(self, digest: str) -> tuple[KeyInfo | None, str | None]:
        return await self.services.keys.shared_lookup(digest)

    async def shared_key_write_back(self, digest: str, info: KeyInfo, generation: str) -> bool:
        return await self.services.keys.shared_write_back(digest, info, generation)

    # ---- /v1/models ------------------------------------------------------------------------------

    async def handle_models(self, scope: Scope, send: Send) -> None:
        try:
            info = await self.authenticate(scope)
        except ProxyError as err:
            await self._send_error(send, err)
            return
        allowed = [a for a in self.snapshot.aliases if info.may_use(a)]
        cards = [{"id": a, "object": "model", "created": 0, "owned_by": "inferchain"} for a in allowed]
        path = scope["path"]
        if path.startswith("/v1/models/"):
            wanted = path[len("/v1/models/") :]
            card = next((c for c in cards if c["id"] == wanted), None)
            if card is None:
                await self._send_error(
                    send,
                    not_found(
                        f"The model '{wanted}' does not exist or is not available to this key."
                        f"{info.scope_note()}"
                    ),
                )
                return
            await self._send_raw(send, 200, orjson.dumps(card), JSON_HEADERS)
            return
        await self._send_raw(send, 200, orjson.dumps({"object": "list", "data": cards}), JSON_HEADERS)

    # ---- inference -------------------------------------------------------------------------------

    # The route decision's parts, kept callable here for benchmarks/proxy_routing.py.

    def _pick_pool(
        self, policy: Policy | None, alias: str, ctx: RequestContext, task: str | None
    ) -> tuple[Pool, str]:
        return route_step.pick_pool(self.services, policy, alias, ctx, task)

    def _route(
        self,
        ctx: RequestContext,
        scope: Scope,
        policy: Policy | None,
        alias: str,
        tokens: int,
        out: int | None,
    ) -> tuple[Pool, str, list[Endpoint]]:
        return route_step.route(self.services, ctx, scope, policy, alias, tokens, out)

    def _candidates(
        self, pool: Pool, policy: Policy | None, tokens: int, out: int | None
    ) -> tuple[list[Endpoint], Pool | None]:
        return route_step.candidates_of(self.services, pool, policy, tokens, out)

    def _state(self, ep: Endpoint) -> EndpointState:
        return self.services.live.of(ep)


def build_proxy_app() -> Proxy:
    """The ASGI app for `/v1/` (and the lifespan handler that starts its background tasks)."""
    return Proxy()
