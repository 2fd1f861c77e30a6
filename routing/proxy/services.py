"""The long-lived objects the request pipeline is handed (routing/proxy/pipeline/).

A step keeps only per-request state (in its RequestContext); everything that outlives a request lives
here: the key cache, the routing snapshot, endpoints' live state, the limit leases, the request-log
writer, the upstream connection pool, the shadow mirror and the kept metric children. The Proxy
(routing/proxy/app.py) builds them, runs their background loops and hands them to the pipeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import orjson
import redis.asyncio as aioredis
from django.conf import settings

from core.redis_client import key as rkey
from routing.proxy.config import Endpoint, RoutingSnapshot
from routing.proxy.health import EndpointState
from routing.proxy.keycache import InDb, KeyCache
from routing.proxy.limits import Limiter
from routing.proxy.predict import Predictors
from routing.proxy.requestlog import RequestLogWriter
from routing.proxy.shadow import ShadowMirror
from routing.proxy.tokens import load_tokenizer
from routing.proxy.upstream import UpstreamPool, split_base_url

LIVE_POLL_S = 0.25
METRIC_CHILDREN_MAX = 10_000


class LiveState:
    """Per-endpoint state of this process (in-flight counts, breakers, the engines' live KV state)."""

    def __init__(self) -> None:
        self.states: dict[str, EndpointState] = {}
        self.rr: dict[str, int] = {}
        # The fleet endpoints of the snapshot last polled and their live keys, built once per snapshot.
        self._polled: tuple[RoutingSnapshot | None, list[Endpoint], list[str]] = (None, [], [])
        # The record each endpoint had at the last poll: an agent writes once per telemetry period (1 s)
        # and this reads four times a second, so most reads find the same bytes and skip the parse.
        self._seen: dict[str, bytes | str] = {}
        self._keys: dict[str, str] = {}  # each endpoint's live key, by endpoint id

    def of(self, ep: Endpoint) -> EndpointState:
        state = self.states.get(ep.id)
        if state is None:
            state = self.states[ep.id] = EndpointState(ep.id)
        return state

    def track(self, snapshot: RoutingSnapshot) -> None:
        states = self.states
        for ep_id in snapshot.endpoints:
            if ep_id not in states:
                states[ep_id] = EndpointState(ep_id)

    def _targets(self, snapshot: RoutingSnapshot) -> tuple[list[Endpoint], list[str]]:
        """The snapshot's fleet endpoints and their live keys; rebuilt when the snapshot is replaced (a
        deployment's change does that), from kept key strings."""
        polled, eps, keys = self._polled
        if polled is not snapshot:
            known = self._keys
            eps = [ep for ep in snapshot.endpoints.values() if ep.deployment_id is not None]
            for ep in eps:
                if ep.id not in known:
                    known[ep.id] = rkey("live", "deployment", str(ep.deployment_id))
            keys = [known[ep.id] for ep in eps]
            self._polled = (snapshot, eps, keys)
            if len(known) > 2 * len(eps) + 64:  # drop what departed endpoints left, now and then
                ids = {ep.id for ep in eps}
                self._keys = {k: v for k, v in known.items() if k in ids}
                self._seen = {k: v for k, v in self._seen.items() if k in ids}
        return eps, keys

    async def poll(self, redis: aioredis.Redis, snapshot: RoutingSnapshot) -> None:
        """One read of every fleet endpoint's live record (KV cache, queue) from Redis."""
        eps, keys = self._targets(snapshot)
        if not eps:
            return
        try:
            raws = await redis.mget(keys)
        except Exception:
            return  # stale live state already counts as busy
        seen = self._seen
        for ep, raw in zip(eps, raws, strict=True):
            if not raw or seen.get(ep.id) == raw:
                continue
            seen[ep.id] = raw
            try:
                live = orjson.loads(raw)
                state = self.states.setdefault(ep.id, EndpointState(ep.id))
                total = live.get("kv_cache_total_tokens")
                if total is None and live.get("num_gpu_blocks") and live.get("block_size"):
                    total = live["num_gpu_blocks"] * live["block_size"]
                state.update_live(float(live.get("ts", 0)), live.get("kv_cache_usage_perc"), total)
            except (orjson.JSONDecodeError, TypeError, ValueError):
                continue


class Leases:
    """The concurrency leases of requests in flight, renewed in Redis while they run."""

    def __init__(self) -> None:
        self.held: dict[str, list[str]] = {}

    async def renew(self, limiter: Limiter) -> None:
        pairs = [(k, rid) for rid, keys in self.held.items() for k in keys]
        with contextlib.suppress(Exception):
            await limiter.renew(pairs)


class MetricChildren:
    """`metric.labels(*values)`, kept: labels() takes a lock and rebuilds its key on every call."""

    def __init__(self) -> None:
        self.children: dict[tuple[Any, tuple[Any, ...]], Any] = {}

    def get(self, metric: Any, *values: Any) -> Any:
        key = (metric, values)
        child = self.children.get(key)
        if child is None:
            if len(self.children) >= METRIC_CHILDREN_MAX:
                self.children.clear()  # bounded: aliases in labels come from requests
            child = self.children[key] = metric.labels(*(str(v) for v in values))
        return child


class Tokenizers:
    """Tokenizers by path, each loaded once, off the event loop."""

    def __init__(self) -> None:
        self.loaded: dict[str, Any] = {}

    async def get(self, path: str) -> Any:
        if path in self.loaded:
            return self.loaded[path]
        # The first load reads a file (maybe hundreds of MB of GGUF): do it off the loop, then keep it.
        tok = await asyncio.get_running_loop().run_in_executor(None, load_tokenizer, path)
        self.loaded[path] = tok
        return tok


def slo_targets(classes: dict[str, str]) -> dict[str, tuple[float, float]]:
    """PROXY_SLO_CLASSES parsed: each class's (TTFT, time per output token) targets in seconds."""
    out: dict[str, tuple[float, float]] = {}
    for name, spec in classes.items():
        ttft, _, tpot = spec.partition("/")
        try:
            out[name] = (float(ttft), float(tpot))
        except ValueError:
            raise ValueError(f"SLO class {name!r}: expected 'ttft/tpot' in seconds, got {spec!r}") from None
    return out


class Services:
    """What the pipeline's steps are given: every long-lived object of one proxy process."""

    def __init__(self, in_db: InDb) -> None:
        self.snapshot = RoutingSnapshot()
        self.keys = KeyCache(in_db)
        self.live = LiveState()
        self.leases = Leases()
        self.upstream = UpstreamPool()
        self.hostports: dict[str, tuple[str, int]] = {}
        self.limiter: Limiter | None = None
        self.redis: aioredis.Redis | None = None  # the shared client (wake requests use it)
        self.reqlog: RequestLogWriter | None = None
        self.shadow = ShadowMirror(self.upstream, self.live.states, None)
        # Every engine's learnt TTFT/TPOT and the output lengths by tenant (routing/proxy/predict.py).
        self.predictors = Predictors()
        self.slo_targets = slo_targets(settings.PROXY_SLO_CLASSES)
        # A bound method, not the object: calling an instance's __call__ costs more on every request.
        self.metric = MetricChildren().get
        # pipeline/account.py's metric children per kind of request.
        self.account_children: dict[tuple[Any, ...], Any] = {}
        self.tokenizers = Tokenizers()
        # Stage chains' built stage objects by (chain name, version): see pipeline/stages.py.
        self.chains: dict[tuple[str, int], Any] = {}
        self.max_body: int = settings.PROXY_MAX_BODY_BYTES
        self.long_prompt_tokens: int = settings.PROXY_LONG_PROMPT_TOKENS
        self.id_prefix = uuid.uuid4().hex[:20]
        self.seq = 0

    def hostport(self, base_url: str) -> tuple[str, int]:
        hostport = self.hostports.get(base_url)
        if hostport is None:
            hostport = self.hostports[base_url] = split_base_url(base_url)
        return hostport

    def next_request_id(self) -> str:
        # Unique across processes (random per-process prefix) without a urandom syscall per request.
        self.seq += 1
        return f"{self.id_prefix}{self.seq:012x}"
