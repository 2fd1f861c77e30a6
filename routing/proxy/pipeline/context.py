"""The one object a request carries through the pipeline's steps (routing/proxy/pipeline/).

Each step reads what earlier steps left here and adds its own part; the request's response, its
limits and its request-log row are all made from it. Long-lived state is never kept here: that is the
services' (routing/proxy/services.py), which the pipeline is handed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from routing.choices import Priority
from routing.proxy.config import Endpoint, KeyInfo, Policy, Pool, Shadow
from routing.proxy.dialect import LlamaCpp
from routing.proxy.errors import ProxyError
from routing.proxy.limits import Admission
from routing.proxy.scorers import ScoreRequest
from routing.proxy.tokens import TokenCount
from routing.proxy.upstream import ClientGone, UpstreamResponse, UpstreamTimeout

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

# A client hang-up is watched for only once a request has been with the engine this long: most answers
# are back sooner, and a watcher (a task blocked in the ASGI `receive()`) costs CPU on every request.
WATCH_DISCONNECT_AFTER_S = 0.02


class StageChain(Protocol):
    """What the steps see of a request's chain (routing/proxy/pipeline/stages.py:Chain builds it)."""

    name: str
    pre: tuple[Any, ...]
    post: tuple[Any, ...]
    # The post-stages that look at answer text (the relay hands them each piece of it).
    answer: tuple[Any, ...]
    # The stages whose response hook runs once the answer is out (post-stages, and pre-stages with one).
    respond: tuple[Any, ...]
    # Whether one of them needs the answer whole (a remote rewrite): the relay then holds it.
    holds: bool
    pool: str | None
    reason: str


class StageRun:
    """One request's pass through its chain: each stage's state, outcome and time on answer text."""

    __slots__ = ("cached", "headers", "outcomes", "pool", "spent", "state", "tap", "took")

    def __init__(self) -> None:
        self.state: dict[str, Any] = {}
        # The pool a pre-stage chose for this request (a classify rule), over the generate step's.
        self.pool: str | None = None
        # "pass" unless the stage says otherwise: masked, blocked, refused, error.
        self.outcomes: dict[str, str] = {}
        self.spent: dict[str, float] = {}
        # Seconds in each stage's request and response hooks (with `spent`: the request log's per-stage ms).
        self.took: dict[str, float] = {}
        # A stored answer a pre-stage found (a cache hit): it is replayed instead of route, admit and call.
        self.cached: dict[str, Any] | None = None
        # Sees the engine's raw answer as the relay passes it on (whole JSON or a batch of SSE events).
        self.tap: Callable[[bytes], None] | None = None
        # Headers the stages add to the answer (x-inferchain-cache).
        self.headers: list[tuple[bytes, bytes]] = []


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
    usage_cached_tokens: int | None = None  # the engine's reported prefix-cache hit, if any
    status: int = 0
    error_type: str = ""
    endpoint: Endpoint | None = None
    pool: str = ""
    route_reason: str = ""
    retries: int = 0
    ttft_s: float | None = None
    # Called once when the answer's first token goes out (`first_token_out`): the predictors take the
    # request out of its engine's prefill queue then (routing/proxy/predict.py).
    on_first_token: Callable[[], None] | None = None
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
    # ---- what the steps hand each other (set in pipeline order) ----
    scope: Scope | None = None
    send: Send | None = None
    # read: the parsed body, the output cap and the field that carries it.
    body: dict[str, Any] | None = None
    requested_out: int | None = None
    max_out_field: str = "max_tokens"
    # count: the prompt's text parts and its token count.
    parts: Sequence[str] = ()
    counted: TokenCount | None = None
    token_prompt: bool = False
    # route: the policy, the pool object, the endpoints to pick from and the time the decision took.
    policy: Policy | None = None
    pool_obj: Pool | None = None
    candidates: Sequence[Endpoint] = ()
    reason: str = ""
    route_time: float = 0.0
    baseline: Callable[[], list[Endpoint]] | None = None
    # The policy's fallback pool and its endpoints that can take the request, for a request that the
    # slo_cost scorer finds no engine of its pool predicted to meet (None: there is no such pool).
    slo_fallback: Callable[[], tuple[Pool, list[Endpoint]] | None] | None = None
    # admit: the tokens reserved, and what the scorer is told.
    reserve: int = 0
    score_req: ScoreRequest | None = None
    # call: the body sent upstream (model name set per endpoint) and whether the client asked for usage.
    upstream_body: dict[str, Any] | None = None
    client_wants_usage: bool = False
    # The engine's dialect when it is not vLLM's (routing/proxy/dialect.py), set per endpoint tried.
    dialect: LlamaCpp | None = None
    # The request's stage chain (None: the fast path, no stage runs) and its stages' per-request state.
    chain: StageChain | None = None
    stage_run: StageRun | None = None

    def first_token_out(self, started: float) -> None:
        """The answer's first generated text goes to the client now: its TTFT, counted from `started`."""
        self.ttft_s = time.perf_counter() - started
        if self.on_first_token is not None:
            self.on_first_token()

    def track_upstream(self, resp: UpstreamResponse) -> None:
        """The engine call in flight (UpstreamPool.post's hook): the one to abort if the client leaves."""
        self.upstream = resp
        if self.client_gone:
            abort(resp)
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


def abort(resp: UpstreamResponse) -> None:
    resp.fail(ClientGone("client disconnected"))
    resp.conn.close()


def client_gone_error() -> ProxyError:
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
                abort(self.ctx.upstream)

    def cancel(self) -> None:
        self.over = True
        if self.timer is not None:
            self.timer.cancel()
        if self.task is not None:
            self.task.cancel()


def header(scope: Scope, wanted: bytes) -> str | None:
    for name, value in scope["headers"]:
        if name == wanted:
            return value.decode("latin-1")
    return None
