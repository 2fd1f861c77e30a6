"""The `/v1/` data plane: a lean ASGI app (no Django middleware, no ORM on the hot path).

One request: auth from an in-process key cache -> body checks -> prompt tokens -> policy picks a pool
-> one Lua call for limits -> a scorer picks an endpoint -> pooled keep-alive upstream call, retried on
another endpoint only before the first byte reaches the client -> usage reconciled -> one request-log
row appended to an in-memory batch. Configuration changes arrive over Redis pub/sub.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import gc
import hmac
import logging
import random
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis.asyncio as aioredis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from console.services import hash_api_key
from core.metrics_access import REFUSAL as METRICS_REFUSAL
from core.metrics_access import metrics_allowed
from core.redis_client import CONFIG_CHANNEL, async_redis, key_cache_generation, key_cache_record
from core.redis_client import key as rkey
from routing.choices import Priority, Scorer
from routing.proxy import bearer, spill
from routing.proxy import metrics as m
from routing.proxy.canary import draw
from routing.proxy.config import (
    WRITE_BACK_LUA,
    Canary,
    Endpoint,
    KeyInfo,
    Policy,
    Pool,
    RoutingSnapshot,
    Shadow,
    key_info_from_record,
    key_record,
    load_key,
    load_keys,
    load_routing_snapshot,
)
from routing.proxy.errors import (
    ProxyError,
    bad_request,
    error_body,
    not_found,
    rate_limited,
    unauthorized,
    unavailable,
)
from routing.proxy.health import EndpointState
from routing.proxy.limits import Admission, Limiter
from routing.proxy.nesting import check_nesting
from routing.proxy.requestlog import RequestLogWriter
from routing.proxy.scorers import EndpointLoad, ScoreRequest, choose, prefix_key, token_prefix_key
from routing.proxy.shadow import MirrorJob, ShadowMirror, pair_writer
from routing.proxy.tokens import (
    chat_roles,
    count_prompt_tokens,
    count_sim_rule,
    load_tokenizer,
    prompt_text_parts,
)
from routing.proxy.upstream import ClientGone, UpstreamPool, UpstreamResponse, UpstreamTimeout, split_base_url
from routing.services import maintain_request_log

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

NEGATIVE_CACHE_S = 5.0
NEGATIVE_CACHE_MAX = 10_000
LIVE_POLL_S = 0.25
# A client hang-up is watched for only once a request has been with the engine this long: most answers
# are back sooner, and a watcher (a task blocked in the ASGI `receive()`) costs CPU on every request.
WATCH_DISCONNECT_AFTER_S = 0.02
METRIC_CHILDREN_MAX = 10_000
DEFAULT_OUTPUT_RESERVE = 1024
JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
FIRST_TOKEN = re.compile(rb'"(?:content|text)": ?"[^"]')
KINDS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/embeddings": "embedding",
}
SUPPORTED_ENDPOINTS = (
    "POST /v1/chat/completions, POST /v1/completions, POST /v1/embeddings (embedding models only), "
    "GET /v1/models and GET /v1/models/{model}"
)
# vLLM's server accepts only this media type on its JSON endpoints (validate_json_request).
JSON_MEDIA_TYPE = "application/json"
# Message roles that may carry `"content": null`, as in vLLM's (and OpenAI's) message types.
NULL_CONTENT_ROLES = ("assistant", "function")


class RetryableUpstreamError(Exception):
    """The upstream failed before anything reached the client: another endpoint may be tried."""

    def __init__(self, reason: str, status: int = 502, *, unreachable: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        # No answer at all (the connection failed): the endpoint is as good as not ready.
        self.unreachable = unreachable


@dataclass(slots=True)
class RequestContext:
    """Everything one request accumulates for its response, its limits and its request-log row."""

    request_id: str
    kind: str
    started: float
    key: KeyInfo | None = None
    alias: str = ""
    stream: bool = False
    priority: str = Priority.INTERACTIVE
    prompt_tokens: int = 0
    prompt_estimated: bool = False
    completion_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    status: int = 0
    error_type: str = ""
    endpoint: Endpoint | None = None
    pool: str = ""
    route_reason: str = ""
    retries: int = 0
    ttft_s: float | None = None
    admission: Admission | None = None
    prompt_text: str | None = None
    response_parts: list[str] = field(default_factory=list)
    receive: Receive | None = None
    client_gone: bool = False
    upstream: UpstreamResponse | None = None
    timer: asyncio.TimerHandle | None = None
    timed_out: bool = False
    # Inter-token timeout of a stream: `progress_at` moves on each chunk; the one timer, when it fires
    # early, re-arms itself for the later of the two bounds instead of failing (see _expire).
    deadline_at: float = 0.0
    idle_s: float = 0.0
    progress_at: float = 0.0
    # "canary" when the request was drawn for its pool's rollout candidate and sent there.
    arm: str = "primary"
    # Drawn for shadow traffic: the request as the client sent it, mirrored once the answer is out.
    shadow: Shadow | None = None
    shadow_body: dict[str, Any] | None = None
    # Whether the answer's text is collected (the tenant logs prompts, or the request is mirrored).
    collect_text: bool = False

    def track_upstream(self, resp: UpstreamResponse) -> None:
        """The engine call in flight (UpstreamPool.post's hook): the one to abort if the client leaves."""
        self.upstream = resp
        if self.client_gone:
            _abort(resp)
        elif self.timed_out:
            resp.fail(UpstreamTimeout("deadline passed"))

    def deadline(self, at: float, idle_s: float = 0.0) -> None:
        """Fail the engine call in flight once `time.perf_counter()` passes `at` (replacing any earlier
        deadline), or, with `idle_s`, once that long passes without `progress_at` moving. One timer moved
        along the call instead of an `asyncio.timeout` per wait: a third of its cost, and a timeout
        surfaces as UpstreamTimeout (a TimeoutError) from the wait in progress."""
        if self.timer is not None:
            self.timer.cancel()
        self.timed_out = False
        now = time.perf_counter()
        self.deadline_at, self.idle_s, self.progress_at = at, idle_s, now
        first = min(at, now + idle_s) if idle_s else at
        self.timer = asyncio.get_running_loop().call_later(max(0.0, first - now), self._expire)

    def clear_deadline(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expire(self) -> None:
        self.timer = None
        if self.idle_s:
            now = time.perf_counter()
            due = min(self.deadline_at, self.progress_at + self.idle_s)
            if due > now:  # tokens arrived since the timer was set: wait for the next bound
                self.timer = asyncio.get_running_loop().call_later(due - now, self._expire)
                return
        self.timed_out = True
        if self.upstream is not None:
            self.upstream.fail(UpstreamTimeout("deadline passed"))


def _abort(resp: UpstreamResponse) -> None:
    resp.fail(ClientGone("client disconnected"))
    resp.conn.close()


def _client_gone_error() -> ProxyError:
    return ProxyError(499, "Client disconnected.", code="client_disconnected")


class DisconnectWatch:
    """Aborts the engine call when the client hangs up (frees the engine's work and the lease at once).

    Armed when the engine call starts; the watcher itself starts only after
    WATCH_DISCONNECT_AFTER_S, so an answer that comes back sooner costs a timer, not a task. The
    request body has been read by then, so the next `receive()` returns only at disconnect (or once
    the response is complete, which is why `cancel` must run right after the last send).
    """

    __slots__ = ("ctx", "over", "task", "timer")

    def __init__(self, ctx: RequestContext) -> None:
        self.ctx = ctx
        self.task: asyncio.Future[Any] | None = None
        self.over = False
        self.timer: asyncio.TimerHandle | None = (
            asyncio.get_running_loop().call_later(WATCH_DISCONNECT_AFTER_S, self._start)
            if ctx.receive is not None
            else None
        )

    def _start(self) -> None:
        self.timer = None
        if self.over or self.ctx.receive is None:
            return
        self.task = asyncio.ensure_future(self.ctx.receive())
        self.task.add_done_callback(self._done)

    def _done(self, fut: asyncio.Future[Any]) -> None:
        if self.over or fut.cancelled() or fut.exception() is not None:
            return
        if fut.result().get("type") == "http.disconnect":
            self.ctx.client_gone = True
            if self.ctx.upstream is not None:
                _abort(self.ctx.upstream)

    def cancel(self) -> None:
        self.over = True
        if self.timer is not None:
            self.timer.cancel()
        if self.task is not None:
            self.task.cancel()


def _bearer(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() != "bearer":
                return None
            return token.strip() or None
    return None


def _header(scope: Scope, wanted: bytes) -> str | None:
    for name, value in scope["headers"]:
        if name == wanted:
            return value.decode("latin-1")
    return None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


# Known OpenAI fields and the checks they must pass; anything else is passed through to the engine.
def _validate_common(body: dict[str, Any], kind: str) -> None:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a string.", param="model")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean.", param="stream")
    if kind == "embedding" and stream:
        raise bad_request("Embeddings cannot be streamed.", param="stream")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise bad_request("'stream_options' must be an object.", param="stream_options")
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (not _is_int(value) or value < 1):
            raise bad_request(f"'{name}' must be a positive integer.", param=name)
    n = body.get("n")
    if n is not None and (not _is_int(n) or not 1 <= n <= 128):
        raise bad_request("'n' must be an integer from 1 to 128.", param="n")
    for name, low, high in (
        ("temperature", 0.0, 2.0),
        ("top_p", 0.0, 1.0),
        ("presence_penalty", -2.0, 2.0),
        ("frequency_penalty", -2.0, 2.0),
    ):
        value = body.get(name)
        if value is not None and (not _is_number(value) or not low <= value <= high):
            raise bad_request(f"'{name}' must be a number from {low:g} to {high:g}.", param=name)
    stop = body.get("stop")
    if stop is not None and not (
        isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise bad_request("'stop' must be a string or a list of strings.", param="stop")
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad_request("'messages' must be a non-empty list.", param="messages")
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
                raise bad_request(f"messages[{i}] must be an object with a string 'role'.", param="messages")
            content = msg.get("content")
            if content is None and "content" in msg and msg["role"] not in NULL_CONTENT_ROLES:
                raise bad_request(
                    f"messages[{i}].content is null; only assistant messages may have a null content. "
                    "Send a string or a list of content parts (or leave 'content' out).",
                    param="messages",
                )
            if content is not None and not isinstance(content, str | list):
                raise bad_request(f"messages[{i}].content must be a string or a list.", param="messages")
    elif kind == "completion":
        prompt = body.get("prompt")
        if not (isinstance(prompt, str) or (isinstance(prompt, list) and prompt)):
            raise bad_request("'prompt' must be a string or a non-empty list.", param="prompt")
    else:
        value = body.get("input")
        if not (isinstance(value, str) or (isinstance(value, list) and value)):
            raise bad_request("'input' must be a string or a non-empty list.", param="input")


def _check_json_media_type(content_type: str | None) -> None:
    """Refuse a body that is not sent as JSON, as vLLM's server does (a 400, whatever the body holds)."""
    if content_type is not None and content_type.split(";", 1)[0].strip().lower() == JSON_MEDIA_TYPE:
        return
    sent = f"'{content_type}'" if content_type else "no Content-Type"
    raise bad_request(
        f"Unsupported Media Type: Only 'application/json' is allowed (this request has {sent}). "
        "Send the JSON body with the header 'Content-Type: application/json'.",
        code="unsupported_media_type",
    )


def unsupported_endpoint(method: str, path: str, alias: str | None = None) -> ProxyError:
    """404 for a /v1/ path nobody here serves, or that the model's engines do not serve."""
    if alias is None:
        what = f"{method} {path} is not served here."
    else:
        what = f"The model '{alias}' does not serve {path}: its engines do not offer that endpoint."
    return ProxyError(404, f"{what} Supported endpoints: {SUPPORTED_ENDPOINTS}.", code="unsupported_endpoint")


def context_length_error(
    max_model_len: int, tokens: int, out: int | None, out_field: str, token_prompt: bool
) -> ProxyError | None:
    """vLLM's refusal (message, status, param) when prompt + output does not fit, else None.

    vLLM checks the output cap first, then the prompt against `max_model_len - max_tokens`; it truncates
    text prompts one token past that and so reports "at least" that many (token-id prompts exactly).
    With no output cap, a prompt that fills the context leaves no room for one token.
    """
    if out is not None and out > max_model_len:
        return bad_request(
            f"{out_field}={out} cannot be greater than max_model_len=max_total_tokens={max_model_len}. "
            f"Please request fewer output tokens. (parameter={out_field}, value={out})",
            param=out_field,
            code="context_length_exceeded",
        )
    max_out = out or 0
    max_in = max_model_len - max_out
    if tokens > max_in:
        count = tokens if token_prompt else max_in + 1
        at_least = "" if token_prompt else "at least "
        return bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{max_out} output tokens and your prompt contains {at_least}{count} input tokens, for a total "
            f"of {at_least}{count + max_out} tokens. Please reduce the length of the input prompt or the "
            f"number of requested output tokens. (parameter=input_tokens, value={count})",
            param="input_tokens",
            code="context_length_exceeded",
        )
    if out is None and tokens >= max_model_len:
        return bad_request(
            f"The decoder prompt (length {tokens}) plus the number of requested output tokens (at least 1) "
            f"is longer than the maximum model length of {max_model_len}. Make sure that `max_model_len` "
            "is no smaller than the number of text tokens (prompt + requested output tokens).",
            code="context_length_exceeded",
        )
    return None


def _is_openai_error(data: bytes) -> bool:
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return isinstance(parsed, dict) and isinstance(parsed.get("error"), dict)


def _rule_matches(rule: Any, alias: str, tokens: int, task: str | None, tenant: str, priority: str) -> bool:
    if rule.aliases is not None and alias not in rule.aliases:
        return False
    if rule.min_prompt_tokens is not None and tokens < rule.min_prompt_tokens:
        return False
    if rule.max_prompt_tokens is not None and tokens > rule.max_prompt_tokens:
        return False
    if rule.tasks is not None and task not in rule.tasks:
        return False
    if rule.tenants is not None and tenant not in rule.tenants:
        return False
    return rule.priority is None or rule.priority == priority


class Proxy:
    """The proxy's state for one process (one event loop) and its ASGI entry point."""

    def __init__(self) -> None:
        self.snapshot = RoutingSnapshot()
        self.keys: dict[str, tuple[KeyInfo, float]] = {}
        self.negative: dict[str, float] = {}
        self.failed_auth = bearer.FailedAuthThrottle(
            settings.PROXY_AUTH_FAILURES_PER_WINDOW, settings.PROXY_AUTH_FAILURE_WINDOW_SECONDS
        )
        self._key_loads: dict[str, asyncio.Future[KeyInfo | None]] = {}
        # Bumped whenever cached keys are dropped: a lookup that began before a drop must not store
        # what it read (it may predate the revocation that caused the drop).
        self._keys_epoch = 0
        self._write_back: Any = None
        self.states: dict[str, EndpointState] = {}
        self.rr: dict[str, int] = {}
        self.leases: dict[str, list[str]] = {}
        self.upstream = UpstreamPool()
        self._hostports: dict[str, tuple[str, int]] = {}
        self.redis: aioredis.Redis | None = None
        self.limiter: Limiter | None = None
        self.reqlog: RequestLogWriter | None = None
        self.pairs: RequestLogWriter | None = None
        self.shadow = ShadowMirror(self.upstream, self.states, None)
        self.db = ThreadPoolExecutor(max_workers=2, thread_name_prefix="proxy-db")
        self.pubsub_healthy = False
        self.tokenizers: dict[str, Any] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._reload_pending = False
        self.max_body = settings.PROXY_MAX_BODY_BYTES
        self.long_prompt_tokens = settings.PROXY_LONG_PROMPT_TOKENS
        self._id_prefix = uuid.uuid4().hex[:20]
        self._metric_children: dict[tuple[Any, tuple[Any, ...]], Any] = {}
        self._seq = 0

    # ---- lifecycle -------------------------------------------------------------------------------

    async def startup(self) -> None:
        if settings.PROXY_LIMITS_ON_REDIS_DOWN != "reject":
            # Fail at start rather than run with a limits mode nobody implemented.
            raise ImproperlyConfigured(
                f"PROXY_LIMITS_ON_REDIS_DOWN={settings.PROXY_LIMITS_ON_REDIS_DOWN!r}: only 'reject' exists"
            )
        loop = asyncio.get_running_loop()
        self.attach_redis(async_redis(settings.REDIS_URL, socket_timeout=1.0, socket_connect_timeout=1.0))
        self.reqlog = RequestLogWriter(settings.REQUEST_LOG_SPOOL_DIR)
        self.reqlog.start(maintain=maintain_request_log)
        self.pairs = pair_writer(settings.REQUEST_LOG_SPOOL_DIR / "shadow_pairs")
        self.pairs.start()
        self.shadow.writer = self.pairs
        try:
            await self.reload_snapshot()
        except Exception:
            log.exception("proxy: initial config load failed; retrying in the background")
        for coro in (self._listen_config(), self._poll_live(), self._renew_leases(), self._refresh_loop()):
            self._tasks.append(loop.create_task(coro))
        # Everything loaded so far (Django, the ORM, the snapshot) lives as long as the process: moving it
        # out of the collector's reach keeps full collections short, and with them the latency tail.
        gc.collect()
        gc.freeze()

    def attach_redis(self, client: aioredis.Redis) -> None:
        """Use `client` for limits and the shared key records (startup does this; tests may too)."""
        self.redis = client
        self.limiter = Limiter(client, lease_ms=settings.PROXY_LEASE_MS)
        self._write_back = client.register_script(WRITE_BACK_LUA)
        self.failed_auth.attach(client)

    async def shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.shadow.close()
        if self.reqlog is not None:
            await self.reqlog.close()
        if self.pairs is not None:
            await self.pairs.close()
        self.upstream.close()
        if self.limiter is not None:
            await self.limiter.aclose()
        if self.redis is not None:
            await self.redis.aclose()
        self.db.shutdown(wait=False)

    async def _in_db(self, fn: Callable[..., Any], *args: Any) -> Any:
        def run() -> Any:
            close_old_connections()
            return fn(*args)

        return await asyncio.get_running_loop().run_in_executor(self.db, run)

    async def reload_snapshot(self) -> None:
        snap: RoutingSnapshot = await self._in_db(load_routing_snapshot)
        for ep_id in snap.endpoints:
            self.states.setdefault(ep_id, EndpointState(ep_id))
        self.snapshot = snap

    def _schedule_reload(self) -> None:
        if self._reload_pending:
            return
        self._reload_pending = True

        async def later() -> None:
            await asyncio.sleep(0.05)  # coalesce a burst of changes into one reload
            self._reload_pending = False
            try:
                await self.reload_snapshot()
            except Exception:
                log.exception("proxy: config reload failed")

        asyncio.get_running_loop().create_task(later())

    def drop_keys(
        self, *, key_id: int | None = None, digest: str | None = None, tenant_id: int | None = None
    ) -> None:
        self._keys_epoch += 1
        self._key_loads.clear()  # later requests start fresh lookups instead of joining older ones
        if digest is not None:
            self.keys.pop(digest, None)
            self.negative.pop(digest, None)
        if key_id is not None or tenant_id is not None:
            for d, (info, _) in list(self.keys.items()):
                if info.id == key_id or info.tenant_id == tenant_id:
                    del self.keys[d]

    def clear_keys(self) -> None:
        self._keys_epoch += 1
        self._key_loads.clear()
        self.keys.clear()

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
                ids = list({info.id for info, _ in self.keys.values()})
                epoch = self._keys_epoch
                if ids:
                    fresh: dict[int, KeyInfo] = await self._in_db(load_keys, ids)
                    if epoch != self._keys_epoch:
                        continue  # keys were dropped meanwhile; what was read may predate that
                    now = time.monotonic()
                    for digest, (info, _) in list(self.keys.items()):
                        if info.id in fresh:
                            self.keys[digest] = (fresh[info.id], now)
                        else:
                            del self.keys[digest]
            except Exception:
                log.exception("proxy: periodic refresh failed")

    async def _poll_live(self) -> None:
        """Engine live state (KV cache, queue) from Redis, for every fleet endpoint, a few times a second."""
        assert self.redis is not None
        while True:
            await asyncio.sleep(LIVE_POLL_S)
            eps = [ep for ep in self.snapshot.endpoints.values() if ep.deployment_id is not None]
            if not eps:
                continue
            try:
                raws = await self.redis.mget(
                    [rkey("live", "deployment", str(ep.deployment_id)) for ep in eps]
                )
            except Exception:
                continue  # stale live state already counts as busy
            for ep, raw in zip(eps, raws, strict=True):
                if not raw:
                    continue
                try:
                    live = orjson.loads(raw)
                    state = self.states.setdefault(ep.id, EndpointState(ep.id))
                    total = live.get("kv_cache_total_tokens")
                    if total is None and live.get("num_gpu_blocks") and live.get("block_size"):
                        total = live["num_gpu_blocks"] * live["block_size"]
                    state.update_live(float(live.get("ts", 0)), live.get("kv_cache_usage_perc"), total)
                except (orjson.JSONDecodeError, TypeError, ValueError):
                    continue

    async def _renew_leases(self) -> None:
        assert self.limiter is not None
        while True:
            await asyncio.sleep(settings.PROXY_LEASE_MS / 3000)
            pairs = [(k, rid) for rid, keys in self.leases.items() for k in keys]
            with contextlib.suppress(Exception):
                await self.limiter.renew(pairs)

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
            await self.handle_inference(scope, receive, send, kind)
        elif path == "/v1/models" or path.startswith("/v1/models/"):
            await self.handle_models(scope, send)
        elif path in ("/metrics", "/v1/metrics"):
            if not metrics_allowed(_header(scope, b"authorization")):
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
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def _send_error(self, send: Send, err: ProxyError, request_id: str | None = None) -> None:
        headers = [*JSON_HEADERS, *err.headers]
        if request_id:
            headers.append((b"x-request-id", request_id.encode()))
        await self._send_raw(send, err.status, err.body(), headers)

    # ---- auth ------------------------------------------------------------------------------------

    async def authenticate(self, scope: Scope) -> KeyInfo:
        raw = _bearer(scope)
        if raw is None:
            raise unauthorized("Missing API key. Send 'Authorization: Bearer <key>'.")
        problem = bearer.malformed(raw)
        if problem is not None:
            self.failed_auth.check(scope)
            raise await self.failed_auth.failed(scope, unauthorized(problem))
        digest = hash_api_key(raw)
        now = time.monotonic()
        cached = self.keys.get(digest)
        # Without a live subscription a cached key is trusted for one second only, so revocation still
        # lands within a second (one indexed query per key per second instead of a push).
        if cached is not None and (self.pubsub_healthy or now - cached[1] < 1.0):
            info = cached[0]
        else:
            self.failed_auth.check(scope)
            if self.negative.get(digest, 0.0) > now:
                raise await self.failed_auth.failed(scope, unauthorized())
            info_or_none = await self._load_key(digest)
            if info_or_none is None:
                if len(self.negative) > NEGATIVE_CACHE_MAX:
                    self.negative.clear()
                self.negative[digest] = now + NEGATIVE_CACHE_S
                raise await self.failed_auth.failed(scope, unauthorized())
            info = info_or_none
        # The dict lookup is by digest; compare once more in constant time before trusting it.
        if not hmac.compare_digest(info.hashed_key, digest):
            raise unauthorized()
        if info.revoked:
            raise unauthorized("This API key has been revoked.")
        if info.expires_at is not None and info.expires_at <= time.time():
            raise unauthorized("This API key has expired.")
        if not info.tenant_active:
            raise ProxyError(403, "This tenant is disabled.", type="permission_error", code="tenant_disabled")
        return info

    async def _load_key(self, digest: str) -> KeyInfo | None:
        pending = self._key_loads.get(digest)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[KeyInfo | None] = asyncio.get_running_loop().create_future()
        self._key_loads[digest] = fut
        epoch = self._keys_epoch
        try:
            info: KeyInfo | None = None
            generation: str | None = None
            # Without a live subscription this process may have missed changes, and Redis is likely
            # the reason: go to the database as before (and write nothing back).
            if self.pubsub_healthy:
                info, generation = await self.shared_key_lookup(digest)
            if info is not None:
                m.KEY_LOOKUPS.labels("redis").inc()
            else:
                info = await self._in_db(load_key, digest)
                m.KEY_LOOKUPS.labels("db").inc()
                if info is not None and generation is not None:
                    await self.shared_key_write_back(digest, info, generation)
            if info is not None and epoch == self._keys_epoch:
                self.keys[digest] = (info, time.monotonic())
            fut.set_result(info)
            return info
        except Exception as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved
            raise unavailable("Key lookup is unavailable; retry shortly.") from exc
        finally:
            if self._key_loads.get(digest) is fut:
                del self._key_loads[digest]

    async def shared_key_lookup(self, digest: str) -> tuple[KeyInfo | None, str | None]:
        """The key's record from Redis if it is current, and the generation seen (None: Redis failed).

        One round trip reads the generation together with the record; a record stamped with an
        older generation predates some key/tenant change and is ignored. The generation returned is
        what a write-back after a database read must still find.
        """
        if self.redis is None:
            return None, None
        try:
            raw_gen, raw = await self.redis.mget([key_cache_generation(), key_cache_record(digest)])
        except Exception:
            return None, None
        generation = raw_gen.decode() if isinstance(raw_gen, bytes) else str(raw_gen or "0")
        if not raw:
            return None, generation
        try:
            record = orjson.loads(raw)
            if record.get("gen") != generation:
                return None, generation
            return key_info_from_record(record), generation
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            return None, generation

    async def shared_key_write_back(self, digest: str, info: KeyInfo, generation: str) -> bool:
        """Share a key read from the database, unless a key/tenant change happened since `generation`."""
        if self._write_back is None:
            return False
        ttl_ms = max(1000, int(settings.PROXY_CONFIG_REFRESH_SECONDS * 1000))
        try:
            written = await self._write_back(
                keys=[key_cache_generation(), key_cache_record(digest)],
                args=[generation, orjson.dumps(key_record(info, generation)), ttl_ms],
            )
        except Exception:
            return False  # the next process to miss reads the database too; nothing is wrong
        return bool(written)

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
                    send, not_found(f"The model '{wanted}' does not exist or is not available to this key.")
                )
                return
            await self._send_raw(send, 200, orjson.dumps(card), JSON_HEADERS)
            return
        await self._send_raw(send, 200, orjson.dumps({"object": "list", "data": cards}), JSON_HEADERS)

    # ---- inference -------------------------------------------------------------------------------

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            raise ProxyError(
                413, f"Request body is larger than {self.max_body} bytes.", code="body_too_large"
            )
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ProxyError(499, "Client disconnected.", code="client_disconnected")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise ProxyError(
                    413, f"Request body is larger than {self.max_body} bytes.", code="body_too_large"
                )
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def handle_inference(self, scope: Scope, receive: Receive, send: Send, kind: str) -> None:
        self._seq += 1
        # Unique across processes (random per-process prefix) without a urandom syscall per request.
        ctx = RequestContext(
            request_id=f"{self._id_prefix}{self._seq:012x}", kind=kind, started=time.perf_counter()
        )
        try:
            await self._inference(ctx, scope, receive, send)
        except ProxyError as err:
            ctx.status = err.status
            ctx.error_type = err.code or err.type
            if err.status == 429:
                m.LIMIT_REJECTIONS.labels(err.code or "rate_limit").inc()
            if err.status != 499:
                await self._send_error(send, err, ctx.request_id)
        except Exception:
            log.exception("proxy: unexpected error")
            ctx.status = 500
            ctx.error_type = "internal_error"
            with contextlib.suppress(Exception):
                await self._send_error(
                    send,
                    ProxyError(
                        500, "The proxy failed unexpectedly.", type="server_error", code="internal_error"
                    ),
                    ctx.request_id,
                )
        finally:
            await self._finish(ctx)

    async def _inference(self, ctx: RequestContext, scope: Scope, receive: Receive, send: Send) -> None:
        ctx.receive = receive
        info = await self.authenticate(scope)
        ctx.key = info
        content_type = _header(scope, b"content-type")
        if content_type != JSON_MEDIA_TYPE:
            _check_json_media_type(content_type)
        raw = await self._read_body(scope, receive)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise bad_request(
                "We could not parse the JSON body of your request.", code="invalid_json"
            ) from None
        if not isinstance(body, dict):
            raise bad_request("The request body must be a JSON object.", code="invalid_json")
        check_nesting(raw, body)
        _validate_common(body, ctx.kind)
        alias: str = body["model"]
        ctx.alias = alias
        ctx.stream = bool(body.get("stream"))
        if alias not in self.snapshot.aliases:
            raise not_found(f"The model '{alias}' does not exist.", param="model")
        if not info.may_use(alias):
            raise ProxyError(
                403,
                f"This API key may not use the model '{alias}'.",
                type="permission_error",
                param="model",
                code="model_not_allowed",
            )
        priority = (_header(scope, b"x-priority") or Priority.INTERACTIVE).lower()
        if priority not in (Priority.INTERACTIVE, Priority.BATCH):
            raise bad_request("Header x-priority must be 'interactive' or 'batch'.", param="x-priority")
        ctx.priority = priority

        # Output cap: the tighter of the key's limit and the request's own.
        max_out_field = (
            "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        )
        requested_out: int | None = body.get(max_out_field)
        cap = info.max_output_tokens()
        if cap is not None and requested_out is not None and requested_out > cap:
            raise bad_request(
                f"'{max_out_field}' is {requested_out}, above this key's limit of {cap} output tokens.",
                param=max_out_field,
                code="max_tokens_exceeded",
            )
        if cap is not None and requested_out is None and ctx.kind != "embedding":
            body["max_tokens"] = cap
            requested_out = cap

        if ctx.kind == "embedding" and alias in self.snapshot.no_embeddings:
            raise unsupported_endpoint("POST", "/v1/embeddings", alias)
        parts = prompt_text_parts(body, ctx.kind)
        model_info = self.snapshot.models.get(alias)
        if model_info is not None and model_info.sim_tokens:
            counted = count_sim_rule(body, ctx.kind)
        else:
            tokenizer = None
            if model_info is not None and model_info.tokenizer_path:
                tokenizer = await self._tokenizer(model_info.tokenizer_path)
            counted = count_prompt_tokens(parts, tokenizer, chat_roles(body) if ctx.kind == "chat" else None)
        prompt = body.get("prompt")
        token_prompt = False
        if ctx.kind == "completion" and isinstance(prompt, list) and all(_is_int(t) for t in prompt):
            # A token-id prompt counts itself exactly.
            counted = type(counted)(tokens=len(prompt), estimated=False, leading_ids=prompt)
            token_prompt = True
        ctx.prompt_tokens = counted.tokens
        ctx.prompt_estimated = counted.estimated
        if info.log_prompts:
            ctx.prompt_text = "\n".join(parts)[:100_000]
        max_in = info.max_input_tokens()
        if max_in is not None and counted.tokens > max_in:
            raise bad_request(
                f"The prompt has {counted.tokens} tokens, above this key's limit of {max_in} input tokens.",
                param="messages" if ctx.kind == "chat" else "prompt",
                code="input_tokens_exceeded",
            )

        t0 = time.perf_counter()
        policy = self.snapshot.policies.get(alias)
        # Embeddings generate nothing: the whole context is the input.
        out = 0 if ctx.kind == "embedding" else requested_out
        pool, reason, candidates = self._route(ctx, scope, policy, alias, counted.tokens, out)
        route_time = time.perf_counter() - t0
        ctx.pool = pool.name
        if not candidates:
            self._raise_no_endpoint(pool, counted.tokens, out, max_out_field, token_prompt)
        # Interactive first: batch may fill only `batch_max_fraction` of the pool's capacity, and the
        # headroom above that is left to interactive requests, which the proxy never sheds.
        if priority == Priority.BATCH and sum(self.states[ep.id].inflight for ep in candidates) >= (
            pool.batch_max_fraction * pool.max_inflight_per_endpoint * len(candidates)
        ):
            raise rate_limited(
                f"Pool '{pool.name}' is saturated for batch traffic; batch requests are shed until it "
                "has room.",
                code="pool_saturated",
                headers=[(b"retry-after", b"1")],
            )

        reserve = counted.tokens + (requested_out or self._default_out(candidates, counted.tokens))
        if ctx.kind == "embedding":
            reserve = counted.tokens
        assert self.limiter is not None
        ctx.admission = await self.limiter.admit(info, ctx.request_id, reserve)
        if ctx.admission is not None and ctx.admission.lease_keys:
            self.leases[ctx.request_id] = ctx.admission.lease_keys

        shadow = self.snapshot.shadows.get(alias)
        if (
            shadow is not None
            and info.shadow_consent
            and ctx.kind != "embedding"
            and body.get("n") in (None, 1)
            and random.random() * 100.0 < shadow.percent
        ):
            ctx.shadow = shadow
            ctx.shadow_body = body
        ctx.collect_text = info.log_prompts or ctx.shadow is not None
        upstream = dict(body)
        if ctx.stream:
            upstream["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        client_wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        score_req = ScoreRequest(
            tokens_needed=reserve,
            prefix_key=(
                token_prefix_key(counted.leading_ids)
                if counted.leading_ids is not None
                else prefix_key("".join(parts))
            )
            if pool.scorer in (Scorer.PREFIX_AFFINITY, Scorer.WEIGHTED)
            else None,
            session_key=_header(scope, pool.session_header.encode())
            if pool.scorer == Scorer.SESSION_AFFINITY
            else None,
        )
        baseline: Callable[[], list[Endpoint]] | None = None
        if ctx.arm == "canary":
            chosen = pool

            def baseline() -> list[Endpoint]:
                return self._candidates(chosen, policy, counted.tokens, out)[0]

        watch = DisconnectWatch(ctx)
        try:
            await self._try_endpoints(
                ctx,
                pool,
                candidates,
                score_req,
                upstream,
                reason,
                route_time,
                send,
                client_wants_usage,
                baseline,
            )
        finally:
            watch.cancel()

    async def _tokenizer(self, path: str) -> Any:
        if path in self.tokenizers:
            return self.tokenizers[path]
        # The first load reads a file (maybe hundreds of MB of GGUF): do it off the loop, then keep it.
        tok = await asyncio.get_running_loop().run_in_executor(None, load_tokenizer, path)
        self.tokenizers[path] = tok
        return tok

    def _pick_pool(
        self, policy: Policy | None, alias: str, ctx: RequestContext, task: str | None
    ) -> tuple[Pool, str]:
        pools = self.snapshot.pools
        assert ctx.key is not None
        if policy is not None:
            for n, rule in enumerate(policy.rules):
                if rule.pool in pools and _rule_matches(
                    rule, alias, ctx.prompt_tokens, task, ctx.key.tenant_name, ctx.priority
                ):
                    return pools[rule.pool], f"policy {policy.name} rule {n}"
            if policy.default_pool and policy.default_pool in pools:
                return pools[policy.default_pool], f"policy {policy.name} default"
        pool = pools.get(alias)
        if pool is None:
            return Pool(name=alias, alias=alias), "no pool"
        return pool, "alias pool"

    def _route(
        self,
        ctx: RequestContext,
        scope: Scope,
        policy: Policy | None,
        alias: str,
        tokens: int,
        out: int | None,
    ) -> tuple[Pool, str, list[Endpoint]]:
        """The proxy's part of the route decision: the pool, why, and the endpoints the scorer picks from
        (the canary candidate's when the request is drawn for it and one can take it)."""
        pool, reason = self._pick_pool(policy, alias, ctx, _header(scope, b"x-task"))
        if pool.canary is not None:
            drawn = self._draw_canary(ctx, pool, pool.canary, scope, tokens, out)
            if drawn:
                return pool, f"{reason}; canary {pool.canary.share:g}%", drawn
        candidates, fallback_used = self._candidates(pool, policy, tokens, out)
        if fallback_used is not None:
            return fallback_used, f"{reason}; fallback {fallback_used.name}", candidates
        if policy is not None and pool.name in policy.spills:
            spilled = spill.route(self, policy.spills[pool.name], candidates, tokens, out)
            if spilled is not None:
                return spilled[0], f"{reason}; {spilled[2]}", spilled[1]
        return pool, reason, candidates

    def _fits(self, ep: Endpoint, tokens: int, out: int | None) -> bool:
        # As vLLM checks: the prompt plus the requested output (at least one token) within max_model_len.
        return ep.max_model_len is None or tokens + (1 if out is None else out) <= ep.max_model_len

    def _candidates(
        self, pool: Pool, policy: Policy | None, tokens: int, out: int | None
    ) -> tuple[list[Endpoint], Pool | None]:
        now = time.monotonic()
        eps = [ep for ep in pool.endpoints if self._fits(ep, tokens, out) and self._state(ep).available(now)]
        if eps or policy is None or not policy.fallback_pool:
            return eps, None
        fallback = self.snapshot.pools.get(policy.fallback_pool)
        if fallback is None:
            return eps, None
        eps = [
            ep for ep in fallback.endpoints if self._fits(ep, tokens, out) and self._state(ep).available(now)
        ]
        return eps, fallback

    def _draw_canary(
        self, ctx: RequestContext, pool: Pool, canary: Canary, scope: Scope, tokens: int, out: int | None
    ) -> list[Endpoint] | None:
        """The candidate's endpoints when this request is drawn for the canary and one can take it;
        None sends it to the pool's own endpoints (a canary never fails a request for want of one)."""
        assert ctx.key is not None
        session = _header(scope, canary.session_header) if canary.sticky_by == "session" else None
        if not draw(canary, session, ctx.key.tenant_id):
            self._metric(m.CANARY_DRAWS, pool.alias, "baseline").inc()
            return None
        now = time.monotonic()
        eps = [
            ep for ep in canary.endpoints if self._fits(ep, tokens, out) and self._state(ep).available(now)
        ]
        if not eps:
            self._metric(m.CANARY_DRAWS, pool.alias, "candidate_unavailable").inc()
            return None
        self._metric(m.CANARY_DRAWS, pool.alias, "candidate").inc()
        ctx.arm = "canary"
        return eps

    def _state(self, ep: Endpoint) -> EndpointState:
        state = self.states.get(ep.id)
        if state is None:
            state = self.states[ep.id] = EndpointState(ep.id)
        return state

    def _raise_no_endpoint(
        self, pool: Pool, tokens: int, out: int | None, out_field: str, token_prompt: bool
    ) -> None:
        if not pool.endpoints and pool.version_id is not None:
            self._raise_if_version_not_ready(pool)
        lens = [ep.max_model_len for ep in pool.endpoints if ep.max_model_len is not None]
        if pool.endpoints and lens and len(lens) == len(pool.endpoints):
            context_error = context_length_error(max(lens), tokens, out, out_field, token_prompt)
            if context_error is not None:
                raise context_error
        raise unavailable(
            f"No healthy endpoint serves '{pool.alias}' right now; retry shortly.", code="no_healthy_endpoint"
        )

    def _raise_if_version_not_ready(self, pool: Pool) -> None:
        """503 naming the version when no ready deployment anywhere runs the version the pool serves.

        Deployments of the alias's other versions never stand in for it: the client is told which
        version is meant, which ones are ready, and what an operator can do.
        """
        snap = self.snapshot
        version = pool.version_id
        mine = [ep for ep in snap.endpoints.values() if ep.served_model_name == pool.alias]
        if any(ep.version_id == version for ep in mine):
            return  # some pool does have it: the usual "no healthy endpoint" answer applies
        label = f"{pool.version_label or 'version'} (id {version})"
        others = sorted(
            {
                f"{snap.version_labels.get(v, 'version')} (id {v})"
                for ep in mine
                if (v := ep.version_id) is not None
            }
        )
        ready = (
            f" Ready deployments of other versions ({', '.join(others)}) do not take its traffic."
            if others
            else ""
        )
        if pool.pinned:
            what = f"The pool '{pool.name}' serves the model '{pool.alias}' with version {label}"
            remedy = "or set the pool's model_version to a version that has one (or clear it)."
        else:
            what = f"The model '{pool.alias}' is served by its active version {label}"
            remedy = f"or switch the alias '{pool.alias}' to a version that has a ready deployment."
        raise ProxyError(
            503,
            f"{what}, which has no ready deployment.{ready} Deploy {label} (or wait for its deployment "
            f"to become ready), {remedy}",
            type="service_unavailable_error",
            param="model",
            code="model_version_not_ready",
        )

    def _default_out(self, candidates: list[Endpoint], tokens: int) -> int:
        lens = [ep.max_model_len for ep in candidates if ep.max_model_len]
        if lens:
            return max(1, min(DEFAULT_OUTPUT_RESERVE, max(lens) - tokens))
        return DEFAULT_OUTPUT_RESERVE

    # ---- upstream --------------------------------------------------------------------------------

    async def _try_endpoints(
        self,
        ctx: RequestContext,
        pool: Pool,
        candidates: list[Endpoint],
        score_req: ScoreRequest,
        upstream: dict[str, Any],
        reason: str,
        route_time: float,
        send: Send,
        client_wants_usage: bool,
        baseline: Callable[[], list[Endpoint]] | None = None,
    ) -> None:
        """Send to one of `candidates`, retrying on another before the first byte reaches the client.

        `baseline` (a canary request only): where to go when no candidate endpoint could even be
        reached. A candidate that answers badly (5xx, timeout) keeps the request: those answers are
        the canary's to own, and its gates must see them.
        """
        tried: set[str] = set()
        last: RetryableUpstreamError | None = None
        unreachable_only = True
        wall = time.time()
        for attempt in range(pool.max_retries + 1):
            now = time.monotonic()
            live = [ep for ep in candidates if ep.id not in tried and self._state(ep).available(now)]
            if not live and baseline is not None and last is not None and unreachable_only:
                candidates, baseline = baseline(), None
                ctx.arm = "primary"
                reason += "; canary candidate unreachable, baseline"
                self._metric(m.CANARY_DRAWS, pool.alias, "candidate_unreachable").inc()
                live = [ep for ep in candidates if ep.id not in tried and self._state(ep).available(now)]
            if not live:
                break
            t0 = time.perf_counter()
            loads = [
                EndpointLoad(
                    endpoint_id=ep.id,
                    inflight=self.states[ep.id].inflight,
                    kv_free_tokens=self.states[ep.id].kv_free_now(wall),
                    kv_total_tokens=self.states[ep.id].kv_total_tokens,
                    max_inflight=pool.max_inflight_per_endpoint,
                )
                for ep in live
            ]
            rr = self.rr.get(pool.name, 0)
            self.rr[pool.name] = rr + 1
            index, why = choose(pool.scorer, loads, score_req, weights=pool.weights, rr=rr)
            ep = live[index]
            decision = route_time + time.perf_counter() - t0
            m.DECISION_SECONDS.observe(decision)
            dep_label = ep.id
            self._metric(m.ROUTE_DECISIONS, pool.name, pool.scorer, dep_label).inc()
            ctx.endpoint = ep
            ctx.route_reason = f"{reason}; {why}" + (f"; retry {attempt}" if attempt else "")
            ctx.retries = attempt
            state = self.states[ep.id]
            state.begin(now, score_req.tokens_needed)
            inflight = self._metric(m.INFLIGHT, dep_label)
            inflight.inc()
            try:
                upstream["model"] = ep.served_model_name
                await self._attempt(ctx, pool, ep, orjson.dumps(upstream), send, client_wants_usage)
                if ctx.status < 500:
                    state.success()
                return
            except RetryableUpstreamError as exc:
                last = exc
                unreachable_only = unreachable_only and exc.unreachable
                tried.add(ep.id)
                if state.failure(time.monotonic()):
                    m.EJECTIONS.labels(dep_label).inc()
                    log.warning("proxy: ejected endpoint %s (%s)", ep.id, exc.reason)
                if attempt < pool.max_retries:
                    m.RETRIES.labels(ctx.alias).inc()
            finally:
                state.end()
                inflight.dec()
        if last is not None and last.status == 504:
            raise ProxyError(
                504,
                f"The model server timed out ({last.reason}).",
                type="server_error",
                code="upstream_timeout",
            )
        if last is not None:
            raise ProxyError(
                502, f"The model server failed ({last.reason}).", type="server_error", code="upstream_error"
            )
        raise unavailable(
            f"No healthy endpoint serves '{pool.alias}' right now; retry shortly.", code="no_healthy_endpoint"
        )

    def _response_headers(
        self, ctx: RequestContext, base: list[tuple[bytes, bytes]]
    ) -> list[tuple[bytes, bytes]]:
        headers = [*base, (b"x-request-id", ctx.request_id.encode())]
        if ctx.admission is not None:
            headers.extend(ctx.admission.headers)
        return headers

    async def _attempt(
        self,
        ctx: RequestContext,
        pool: Pool,
        ep: Endpoint,
        payload: bytes,
        send: Send,
        client_wants_usage: bool,
    ) -> None:
        path = (
            "/v1/chat/completions"
            if ctx.kind == "chat"
            else "/v1/completions"
            if ctx.kind == "completion"
            else "/v1/embeddings"
        )
        hostport = self._hostports.get(ep.base_url)
        if hostport is None:
            hostport = self._hostports[ep.base_url] = split_base_url(ep.base_url)
        extra = b"Authorization: Bearer " + ep.api_key.encode() + b"\r\n" if ep.api_key else b""
        started = time.perf_counter()
        deadline = started + pool.total_timeout_s
        # Non-streaming answers arrive whole, so for them only the total timeout applies.
        header_budget = pool.first_byte_timeout_s if ctx.stream else pool.total_timeout_s
        ctx.deadline(started + header_budget)
        try:
            resp = await self.upstream.post(
                hostport[0],
                hostport[1],
                path,
                payload,
                extra,
                pool.connect_timeout_s,
                ctx.track_upstream,
            )
        except TimeoutError:
            ctx.clear_deadline()
            raise RetryableUpstreamError("no response before the first-byte timeout", 504) from None
        except OSError as exc:
            ctx.clear_deadline()
            if ctx.client_gone:
                raise _client_gone_error() from None
            raise RetryableUpstreamError(f"connect failed: {type(exc).__name__}", unreachable=True) from None
        try:
            if resp.status >= 500:
                raise RetryableUpstreamError(f"HTTP {resp.status}")
            if not ctx.stream or resp.status != 200:
                try:
                    if not resp.complete:
                        ctx.deadline(deadline)
                    data = await resp.read()
                except TimeoutError:
                    raise RetryableUpstreamError("total timeout", 504) from None
                except OSError as exc:
                    if ctx.client_gone:
                        raise _client_gone_error() from None
                    raise RetryableUpstreamError(f"read failed: {type(exc).__name__}") from None
                # No time to first token for a whole answer: it arrives at once, so TTFT stays empty.
                ctx.status = resp.status
                if resp.status == 200:
                    self._usage_from(ctx, data)
                elif resp.status >= 400:
                    if resp.status in (404, 405) and not _is_openai_error(data):
                        # The engine has no such route (FastAPI's {"detail": "Not Found"}).
                        raise unsupported_endpoint("POST", path, ctx.alias)
                    ctx.error_type = f"upstream_{resp.status}"
                await self._send_raw(send, resp.status, data, self._response_headers(ctx, JSON_HEADERS))
                return
            await self._stream(ctx, pool, resp, started, deadline, send, client_wants_usage)
        finally:
            ctx.clear_deadline()
            # Forget it before it goes back to the pool: a later hang-up must not close a connection
            # that another request may be using by then.
            ctx.upstream = None
            resp.release()

    def _usage_from(self, ctx: RequestContext, data: bytes) -> None:
        try:
            parsed = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        usage = parsed.get("usage") if isinstance(parsed, dict) else None
        if isinstance(usage, dict):
            ctx.completion_tokens = usage.get("completion_tokens") or 0
            ctx.usage_prompt_tokens = usage.get("prompt_tokens")
        if ctx.collect_text and isinstance(parsed, dict):
            for choice in parsed.get("choices") or []:
                msg = choice.get("message") or {}
                text = msg.get("content") if isinstance(msg, dict) else None
                text = text if isinstance(text, str) else choice.get("text")
                if isinstance(text, str):
                    ctx.response_parts.append(text)

    async def _stream(
        self,
        ctx: RequestContext,
        pool: Pool,
        resp: UpstreamResponse,
        started: float,
        deadline: float,
        send: Send,
        client_wants_usage: bool,
    ) -> None:
        # Wait for the first chunk before answering the client: until then a failure is retryable.
        try:
            first = resp.read_nowait()
            if first is None:
                first = await resp.readany()  # still under the first-byte deadline set before the call
        except TimeoutError:
            raise RetryableUpstreamError("no first token before the first-byte timeout", 504) from None
        except OSError as exc:
            if ctx.client_gone:
                raise _client_gone_error() from None
            raise RetryableUpstreamError(f"stream failed before first byte: {type(exc).__name__}") from None
        if not first:
            raise RetryableUpstreamError("stream closed before first byte")
        ctx.status = 200
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": self._response_headers(ctx, SSE_HEADERS),
            }
        )
        buffer = b""
        chunks = 0
        done = False
        ended = False
        chunk: bytes = first
        log_text = ctx.collect_text
        # A short answer is usually all in by now: then nothing below waits, and no timer is needed.
        if resp.complete:
            ctx.clear_deadline()
        else:
            ctx.deadline(deadline, pool.inter_token_timeout_s)
        try:
            while True:
                ctx.progress_at = time.perf_counter()
                buffer += chunk
                cut = buffer.rfind(b"\n\n")
                if cut >= 0:
                    events, buffer = buffer[: cut + 2], buffer[cut + 2 :]
                    # TTFT is the first generated text, not the first byte (engines send the role first).
                    if ctx.ttft_s is None and FIRST_TOKEN.search(events):
                        ctx.ttft_s = time.perf_counter() - started
                    out = self._filter_events(ctx, events, client_wants_usage, log_text)
                    chunks += events.count(b"data: ") - events.count(b"data: [DONE]")
                    if b"data: [DONE]" in events:
                        done = True
                    if out:
                        # The last events and the end of the response go out in one write.
                        await send({"type": "http.response.body", "body": out, "more_body": not done})
                        ended = done
                if done:
                    break
                chunk = await resp.readany()
                if not chunk:
                    break
        except (TimeoutError, OSError) as exc:
            ctx.error_type = "upstream_timeout" if isinstance(exc, TimeoutError) else "upstream_disconnected"
        if ctx.client_gone:
            # Nobody to tell; the engine already saw its connection close and stopped generating.
            ctx.status = 499
            ctx.error_type = "client_disconnected"
            if ctx.completion_tokens is None:
                ctx.completion_tokens = max(0, chunks - 1)
            return
        if not done:
            if not ctx.error_type:
                ctx.error_type = "upstream_disconnected"
            ctx.status = 502 if ctx.error_type == "upstream_disconnected" else 504
            state = self._state(ctx.endpoint) if ctx.endpoint else None
            if state is not None and state.failure(time.monotonic()):
                m.EJECTIONS.labels(ctx.endpoint.id if ctx.endpoint else "").inc()
            event = error_body(
                "The model server stopped in the middle of the answer; the output above is incomplete.",
                type="server_error",
                code=ctx.error_type,
            )
            with contextlib.suppress(Exception):
                await send(
                    {
                        "type": "http.response.body",
                        "body": b"data: " + event + b"\n\ndata: [DONE]\n\n",
                        "more_body": True,
                    }
                )
        if ctx.completion_tokens is None:
            ctx.completion_tokens = max(0, chunks - 1)  # an estimate: one token per content chunk
        if not ended:
            await send({"type": "http.response.body", "body": b""})

    def _filter_events(
        self, ctx: RequestContext, events: bytes, client_wants_usage: bool, log_text: bool
    ) -> bytes:
        """Read usage from the stream; drop the usage-only chunk when the client did not ask for it."""
        if not log_text:
            return self._usage_event(ctx, events, client_wants_usage)
        kept: list[bytes] = []
        for event in events.split(b"\n\n"):
            if not event:
                continue
            keep = True
            if event.startswith(b"data: {"):
                try:
                    obj = orjson.loads(event[6:])
                except orjson.JSONDecodeError:
                    obj = None
                if isinstance(obj, dict):
                    usage = obj.get("usage")
                    if isinstance(usage, dict):
                        ctx.completion_tokens = usage.get("completion_tokens") or 0
                        ctx.usage_prompt_tokens = usage.get("prompt_tokens")
                        if not obj.get("choices") and not client_wants_usage:
                            keep = False
                    if log_text:
                        for choice in obj.get("choices") or []:
                            delta = choice.get("delta") or {}
                            text = delta.get("content") if isinstance(delta, dict) else None
                            text = text if isinstance(text, str) else choice.get("text")
                            if isinstance(text, str):
                                ctx.response_parts.append(text)
            if keep:
                kept.append(event + b"\n\n")
        return b"".join(kept)

    def _usage_event(self, ctx: RequestContext, events: bytes, client_wants_usage: bool) -> bytes:
        """Parse only the last event that carries usage (found by its bytes); the rest pass untouched.

        `"usage":{` cannot occur inside a JSON string (its quotes would be escaped), so the marker finds
        exactly the events with a usage object. The engine sends usage in the last chunk (with
        `continuous_usage_stats` in every chunk), so the last one in a batch is the current total.
        """
        at = events.rfind(b'"usage":{')
        if at < 0:
            at = events.rfind(b'"usage": {')
            if at < 0:
                return events
        begin = events.rfind(b"\n\n", 0, at)
        begin = 0 if begin < 0 else begin + 2
        end = events.find(b"\n\n", at)
        end = len(events) if end < 0 else end + 2
        event = events[begin:end]
        if not event.startswith(b"data: {"):
            return events
        try:
            obj = orjson.loads(event[6:])
        except orjson.JSONDecodeError:
            return events
        usage = obj.get("usage") if isinstance(obj, dict) else None
        if not isinstance(usage, dict):
            return events
        ctx.completion_tokens = usage.get("completion_tokens") or 0
        ctx.usage_prompt_tokens = usage.get("prompt_tokens")
        if client_wants_usage or obj.get("choices"):
            return events
        return events[:begin] + events[end:]

    # ---- accounting ------------------------------------------------------------------------------

    def _metric(self, metric: Any, *values: Any) -> Any:
        """`metric.labels(*values)`, kept: labels() takes a lock and rebuilds its key on every call."""
        key = (metric, values)
        child = self._metric_children.get(key)
        if child is None:
            if len(self._metric_children) >= METRIC_CHILDREN_MAX:
                self._metric_children.clear()  # bounded: aliases in labels come from requests
            child = self._metric_children[key] = metric.labels(*(str(v) for v in values))
        return child

    def _mirror(self, ctx: RequestContext, latency: float) -> None:
        """Mirror an answered request to the shadow candidate (after the client has its answer)."""
        shadow = ctx.shadow
        assert shadow is not None and ctx.shadow_body is not None
        if ctx.status != 200 or ctx.error_type or ctx.endpoint is None:
            m.SHADOW_SKIPPED.labels(shadow.alias, "primary_failed").inc()
            return
        pool = self.snapshot.pools.get(ctx.pool)
        per_endpoint = pool.max_inflight_per_endpoint if pool else 64
        fraction = pool.batch_max_fraction if pool else 0.8
        self.shadow.submit(
            MirrorJob(
                shadow=shadow,
                request_id=ctx.request_id,
                kind=ctx.kind,
                tenant_id=ctx.key.tenant_id if ctx.key else None,
                body=ctx.shadow_body,
                primary_version_id=ctx.endpoint.version_id,
                primary_output="".join(ctx.response_parts),
                primary_latency_ms=latency * 1000,
                room_per_endpoint=fraction * per_endpoint,
                connect_timeout_s=pool.connect_timeout_s if pool else 2.0,
            )
        )

    async def _finish(self, ctx: RequestContext) -> None:
        latency = time.perf_counter() - ctx.started
        prompt = ctx.usage_prompt_tokens if ctx.usage_prompt_tokens is not None else ctx.prompt_tokens
        completion = ctx.completion_tokens or 0
        if ctx.admission is not None:
            self.leases.pop(ctx.request_id, None)
            # A request the engine never answered used nothing: the whole reservation goes back.
            answered = 0 < ctx.status < 400 or ctx.completion_tokens is not None
            used = prompt + completion if answered else 0
            assert self.limiter is not None
            await self.limiter.finish(ctx.admission, used)
        dep = ctx.endpoint.id if ctx.endpoint else ""
        self._metric(m.REQUESTS, ctx.alias, dep, ctx.status).inc()
        code = _STATUS_CLASSES.get(ctx.status // 100, "other")
        tenant = ctx.key.tenant_name if ctx.key else ""
        self._metric(m.TENANT_REQUESTS, tenant, code).inc()
        self._metric(m.TENANT_LATENCY, tenant).observe(latency)
        if ctx.pool:
            length = "long" if prompt >= self.long_prompt_tokens else "short"
            self._metric(m.POOL_REQUESTS, ctx.pool, length, code).inc()
            self._metric(m.POOL_LATENCY, ctx.pool, length).observe(latency)
        if ctx.endpoint is not None:
            self._metric(m.LATENCY, ctx.alias, dep).observe(latency)
            if ctx.ttft_s is not None:
                self._metric(m.TTFT, ctx.alias, dep).observe(ctx.ttft_s)
            self._metric(m.TOKENS, ctx.alias, "prompt").inc(prompt)
            self._metric(m.TOKENS, ctx.alias, "completion").inc(completion)
            self._metric(m.TENANT_TOKENS, tenant, "prompt").inc(prompt)
            self._metric(m.TENANT_TOKENS, tenant, "completion").inc(completion)
            version_id = ctx.endpoint.version_id
            labels = self.snapshot.version_labels
            version = "static" if version_id is None else labels.get(version_id) or str(version_id)
            self._metric(m.VERSION_REQUESTS, ctx.alias, version, ctx.arm, code).inc()
            self._metric(m.VERSION_LATENCY, ctx.alias, version, ctx.arm).observe(latency)
            if ctx.ttft_s is not None:
                self._metric(m.VERSION_TTFT, ctx.alias, version, ctx.arm).observe(ctx.ttft_s)
        if ctx.shadow is not None:
            self._mirror(ctx, latency)
        if ctx.key is None or self.reqlog is None:
            return  # unauthenticated noise is counted in metrics, not logged per row
        key = ctx.key
        self.reqlog.add(
            {
                "created_at": _utcnow(),
                "request_id": ctx.request_id,
                "key_id": key.id,
                "tenant_id": key.tenant_id,
                "tenant_name": key.tenant_name,
                "key_prefix": key.prefix,
                "endpoint_kind": ctx.kind,
                "alias": ctx.alias[:100],
                "deployment_id": ctx.endpoint.deployment_id if ctx.endpoint else None,
                "model_version_id": ctx.endpoint.version_id if ctx.endpoint else None,
                "upstream": ctx.endpoint.base_url if ctx.endpoint else "",
                "status": ctx.status,
                "error_type": ctx.error_type[:64],
                "stream": ctx.stream,
                "priority": ctx.priority,
                "prompt_tokens": prompt if ctx.alias else None,
                "prompt_tokens_estimated": ctx.prompt_estimated and ctx.usage_prompt_tokens is None,
                "completion_tokens": ctx.completion_tokens,
                "ttft_ms": ctx.ttft_s * 1000 if ctx.ttft_s is not None else None,
                "latency_ms": latency * 1000,
                "retries": ctx.retries,
                "route_pool": ctx.pool[:100],
                "route_reason": ctx.route_reason[:200],
                "prompt_text": ctx.prompt_text if key.log_prompts else None,
                "response_text": "".join(ctx.response_parts) if key.log_prompts else None,
            }
        )


_STATUS_CLASSES = {1: "1xx", 2: "2xx", 3: "3xx", 4: "4xx", 5: "5xx"}


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def build_proxy_app() -> Proxy:
    """The ASGI app for `/v1/` (and the lifespan handler that starts its background tasks)."""
    return Proxy()
