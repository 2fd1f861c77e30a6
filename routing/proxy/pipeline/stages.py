"""Steps 4 and 9, pre-stages and post-stages: the policy's chain around the one generation step.

A stage has the interface of an Envoy filter or a Kong plugin: `on_request` before generation (it may
change the request or refuse it with a ProxyError), `on_text` for each piece of answer text as it
streams, `on_end` when the answer's text is complete, and `on_response` once the answer is out. A stage
object is built once per chain version (its configuration, e.g. a compiled pattern) and keeps its
per-request state in the context (`run_of(ctx).state[name]`), never on itself.

With no chain for the request, nothing here runs: `select` is one dict lookup when chains exist at all.
Every hook's time and every stage's outcome go to Prometheus (inferchain_proxy_stage_*); a stage that
raises fails that request only, with a 500 naming the stage, and is logged with its name.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncGenerator, Awaitable, Sequence
from typing import Any

import orjson
import redis.asyncio as aioredis

from routing.proxy import answercache, pin, responseformat
from routing.proxy import metrics as m
from routing.proxy.config import ChainSpec
from routing.proxy.errors import ProxyError
from routing.proxy.pipeline import remote
from routing.proxy.pipeline.context import RequestContext, StageRun, header
from routing.proxy.services import Services
from routing.proxy.stagespec import (
    DEFAULT_LABEL_MAX_TOKENS,
    DEFAULT_REMOTE_MAX_TOKENS,
    DEFAULT_REMOTE_TIMEOUT_MS,
    StageSpec,
    guard_pattern,
)

log = logging.getLogger("routing.proxy.app")

# Characters a regex term may match at most, when the chain does not say (how much a stream holds back).
DEFAULT_MAX_MATCH_CHARS = 64


def run_of(ctx: RequestContext) -> StageRun:
    run = ctx.stage_run
    assert run is not None
    return run


def content_filter(message: str) -> ProxyError:
    """OpenAI's refusal for content a filter stopped (the code its clients check for)."""
    return ProxyError(400, message, type="invalid_request_error", code="content_filter")


class Stage:
    """One stage of a chain; subclasses override the hooks they need."""

    kind = "stage"
    # Whether the stage looks at answer text (then the relay hands it each piece of a stream).
    on_answer = False
    # Whether it needs the answer whole (a remote rewrite): then the relay holds the answer until it is
    # complete and hands it to `rewrite` instead of `on_text`/`on_end` (relay.held_whole/held_stream).
    holds = False

    def __init__(self, spec: StageSpec, chain: str) -> None:
        self.name = spec.name
        self.chain = chain
        # This stage's metric children by hook and by outcome (a few each), kept with the stage.
        self.seconds_children: dict[str, Any] = {}
        self.outcome_children: dict[str, Any] = {}

    def seconds_of(self, hook: str) -> Any:
        child = self.seconds_children.get(hook)
        if child is None:
            child = self.seconds_children[hook] = m.STAGE_SECONDS.labels(self.chain, self.name, hook)
        return child

    def outcome_of(self, outcome: str) -> Any:
        child = self.outcome_children.get(outcome)
        if child is None:
            child = self.outcome_children[outcome] = m.STAGE_OUTCOMES.labels(self.chain, self.name, outcome)
        return child

    async def on_request(self, ctx: RequestContext, svc: Services) -> None:
        """Before generation: look at (or change) `ctx.body`, or raise a ProxyError to refuse."""

    def on_text(self, ctx: RequestContext, index: int, text: str) -> str:
        """A piece of choice `index`'s answer text on its way to the client: what to send instead."""
        return text

    def on_end(self, ctx: RequestContext, index: int) -> str:
        """Choice `index`'s text is complete: what the stage still holds back, to send now."""
        return ""

    async def on_response(self, ctx: RequestContext, svc: Services) -> None:
        """After the answer is out (the request's status and usage are known)."""

    async def rewrite(self, ctx: RequestContext, svc: Services, text: str) -> str:
        """A holding stage: choice's whole answer text -> what the client gets instead."""
        return text


class Guard(Stage):
    """Sensitive terms of the tenant: block (OpenAI's content_filter error) or mask them, in the prompt
    (as a pre-stage) or in the answer (as a post-stage), streamed answers too.

    A streamed answer is held back only as many characters as the longest term needs (its length
    minus one), so a term split across two chunks is still found and streaming stays streaming.
    """

    kind = "guard"

    def __init__(self, spec: StageSpec, chain: str, *, post: bool) -> None:
        super().__init__(spec, chain)
        terms: list[str] = spec.config["terms"]
        regex = bool(spec.config.get("regex", False))
        self.pattern = guard_pattern(terms, regex)
        self.block = spec.config.get("action", "block") == "block"
        longest = (
            int(spec.config.get("max_match_chars", DEFAULT_MAX_MATCH_CHARS))
            if regex
            else max(map(len, terms))
        )
        self.hold = max(0, longest - 1)
        self.on_answer = post

    def _mask(self, text: str) -> str:
        return self.pattern.sub(lambda found: "*" * len(found.group(0)), text)

    async def on_request(self, ctx: RequestContext, svc: Services) -> None:
        body = ctx.body
        assert body is not None
        if not any(self.pattern.search(part) for part in ctx.parts):
            run_of(ctx).outcomes[self.name] = "pass"
            return
        if self.block:
            run_of(ctx).outcomes[self.name] = "blocked"
            raise content_filter(
                "The prompt contains a term this tenant's content policy does not allow; remove it and retry."
            )
        run_of(ctx).outcomes[self.name] = "masked"
        for msg in body.get("messages") or []:
            content = msg.get("content") if isinstance(msg, dict) else None
            if isinstance(content, str):
                msg["content"] = self._mask(content)
            elif isinstance(content, list):
                for part in content:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        part["text"] = self._mask(part["text"])
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            body["prompt"] = self._mask(prompt)
        elif isinstance(prompt, list):
            body["prompt"] = [self._mask(p) if isinstance(p, str) else p for p in prompt]
        ctx.parts = [self._mask(p) for p in ctx.parts]

    def _state(self, ctx: RequestContext) -> dict[int, str]:
        state: dict[int, str] | None = run_of(ctx).state.get(self.name)
        if state is None:
            state = run_of(ctx).state[self.name] = {}
        return state

    def on_text(self, ctx: RequestContext, index: int, text: str) -> str:
        state = self._state(ctx)
        pending = state.get(index, "") + text
        if self.pattern.search(pending) is not None:
            if self.block:
                run_of(ctx).outcomes[self.name] = "blocked"
                raise content_filter(
                    "The answer contained a term this tenant's content policy does not allow."
                )
            run_of(ctx).outcomes[self.name] = "masked"
            pending = self._mask(pending)
        if len(pending) <= self.hold:
            state[index] = pending
            return ""
        # A term that starts before `cut` would be complete by now (it is at most hold + 1 long), so
        # whatever goes out has been checked.
        cut = len(pending) - self.hold
        state[index] = pending[cut:]
        return pending[:cut]

    def on_end(self, ctx: RequestContext, index: int) -> str:
        return self._state(ctx).pop(index, "")


# Code in a prompt: a fenced block, or a line that starts the way code lines do, or ends in ; { or }.
CODE = re.compile(
    r"```|^[ \t]*(?:def|class|import|from \S+ import|function|const|let|var|#include|public|private|fn|func"
    r"|package|SELECT|INSERT|UPDATE)\b|[;{}][ \t]*$",
    re.MULTILINE,
)
IMAGE_PARTS = ("image_url", "input_image", "image")


class Classify(Stage):
    """Choose the pool from the request's content when the client does not say: prompt length,
    keywords or regular expressions, code, images, conversation depth; first matching rule wins."""

    kind = "classify"

    def __init__(self, spec: StageSpec, chain: str) -> None:
        super().__init__(spec, chain)
        self.rules: list[tuple[dict[str, Any], re.Pattern[str] | None, str]] = []
        for rule in spec.config.get("rules") or []:
            match = dict(rule.get("match") or {})
            words = match.get("keywords")
            pattern = guard_pattern(words, bool(match.get("regex"))) if words else None
            self.rules.append((match, pattern, rule["pool"]))

    async def on_request(self, ctx: RequestContext, svc: Services) -> None:
        body = ctx.body
        assert body is not None
        raw = body.get("messages")
        messages: list[Any] = raw if isinstance(raw, list) else []
        text = "\n".join(ctx.parts)
        code: bool | None = None
        images: bool | None = None
        run = run_of(ctx)
        for n, (match, pattern, pool) in enumerate(self.rules, 1):  # from 1, as the console numbers them
            tokens = ctx.prompt_tokens
            if "min_prompt_tokens" in match and tokens < match["min_prompt_tokens"]:
                continue
            if "max_prompt_tokens" in match and tokens > match["max_prompt_tokens"]:
                continue
            if "min_messages" in match and len(messages) < match["min_messages"]:
                continue
            if "max_messages" in match and len(messages) > match["max_messages"]:
                continue
            if pattern is not None and pattern.search(text) is None:
                continue
            if "code" in match:
                if code is None:
                    code = CODE.search(text) is not None
                if code != match["code"]:
                    continue
            if "images" in match:
                if images is None:
                    images = any(
                        isinstance(part, dict) and part.get("type") in IMAGE_PARTS
                        for msg in messages
                        if isinstance(msg, dict) and isinstance(msg.get("content"), list)
                        for part in msg["content"]
                    )
                if images != match["images"]:
                    continue
            run.pool = pool
            run.outcomes[self.name] = f"rule {n} -> {pool}"
            return


class CacheVisit:
    """One request's pass through a cache stage: its entry's name and what the relay passed on."""

    __slots__ = ("name", "recorder")

    def __init__(self, name: str, recorder: answercache.Recorder | None) -> None:
        self.name = name
        # None: nothing is stored (the client said no-store, or Redis failed at lookup).
        self.recorder = recorder


class Cache(Stage):
    """Exact-match answers to deterministic requests (temperature 0 or a seed, one choice), per tenant,
    in Redis (routing/proxy/answercache.py). A hit is answered by pipeline/replay.py instead of route,
    admit and call; a miss records the engine's raw answer and stores it once it is out. Redis down:
    the request goes on to the engine (fail open). `x-inferchain-cache: hit | miss | bypass | skip` on
    the answer says which."""

    kind = "cache"

    def __init__(self, spec: StageSpec, chain: str) -> None:
        super().__init__(spec, chain)
        self.config = answercache.CacheConfig.of(spec.config)
        self.store = answercache.Store()

    def _outcome(self, ctx: RequestContext, outcome: str, said: bytes) -> None:
        run = run_of(ctx)
        run.outcomes[self.name] = outcome
        run.headers.append((b"x-inferchain-cache", said))
        m.CACHE_LOOKUPS.labels(self.chain, self.name, said.decode()).inc()

    async def on_request(self, ctx: RequestContext, svc: Services) -> None:
        body, scope, key = ctx.body, ctx.scope, ctx.key
        assert body is not None and scope is not None and key is not None
        if ctx.kind == "embedding" or not answercache.deterministic(body):
            self._outcome(ctx, "skip", b"skip")
            return
        asked = (header(scope, b"x-inferchain-cache") or "").lower()
        control = (header(scope, b"cache-control") or "").lower()
        if "no-store" in control:
            self._outcome(ctx, "bypass", b"bypass")  # neither read nor written
            return
        # A request naming its version (routing/proxy/pin.py) shares entries only with that version's.
        pinned = pin.requested_version(scope)
        versions = answercache.served_versions(svc.snapshot, ctx.alias) if pinned is None else f"pin:{pinned}"
        name = answercache.digest(ctx.kind, ctx.alias, versions, body)
        recorder = answercache.Recorder()
        visit = run_of(ctx).state[self.name] = CacheVisit(name, recorder)
        if asked == "bypass" or "no-cache" in control:
            # Not read; the fresh answer replaces the entry.
            run_of(ctx).tap = recorder
            self._outcome(ctx, "bypass", b"bypass")
            return
        if svc.redis is None:
            visit.recorder = None
            self._outcome(ctx, "unavailable, failed open", b"miss")
            return
        try:
            entry = await answercache.lookup(svc.redis, key.tenant_id, name)
        except (aioredis.RedisError, OSError) as exc:
            log.warning("proxy: cache stage %s: Redis lookup failed (%s); failing open", self.name, exc)
            visit.recorder = None
            self._outcome(ctx, "unavailable, failed open", b"miss")
            return
        if entry is not None:
            run_of(ctx).cached = entry
            self._outcome(ctx, "hit", b"hit")
            return
        run_of(ctx).tap = recorder
        self._outcome(ctx, "miss", b"miss")

    async def on_response(self, ctx: RequestContext, svc: Services) -> None:
        run = run_of(ctx)
        visit = run.state.get(self.name)
        if (
            not isinstance(visit, CacheVisit)
            or visit.recorder is None
            or run.cached is not None
            or ctx.status != 200
            or ctx.error_type
            or ctx.client_gone
            or svc.redis is None
        ):
            return
        assert ctx.key is not None
        answer = visit.recorder.answer(ctx.kind)
        if answer is None:
            m.CACHE_STORES.labels(self.chain, self.name, "not_replayable").inc()
            return
        value = orjson.dumps(answer)
        if len(value) > self.config.max_entry_bytes:
            m.CACHE_STORES.labels(self.chain, self.name, "too_large").inc()
            return
        try:
            evicted = await self.store.put(svc.redis, ctx.key.tenant_id, visit.name, value, self.config)
        except (aioredis.RedisError, OSError) as exc:
            log.warning("proxy: cache stage %s: Redis store failed (%s)", self.name, exc)
            m.CACHE_STORES.labels(self.chain, self.name, "failed").inc()
            return
        m.CACHE_STORES.labels(self.chain, self.name, "stored").inc()
        if evicted:
            m.CACHE_EVICTIONS.labels(self.chain, self.name).inc(evicted)


def remote_failed(ctx: RequestContext, stage: Stage, exc: remote.RemoteFailure, fail_open: bool) -> None:
    """A call to a CPU engine failed: the outcome says how ("timeout, failed open"); failing closed
    refuses the request with a 503 that names the stage."""
    run_of(ctx).outcomes[stage.name] = f"{exc.why}, failed {'open' if fail_open else 'closed'}"
    log.warning("proxy: stage %s of chain %s: %s", stage.name, stage.chain, exc)
    if fail_open:
        return
    what = {"timeout": "timed out", "unavailable": "found no healthy CPU endpoint"}.get(exc.why, "failed")
    raise ProxyError(
        503,
        f"The stage '{stage.name}' of the chain '{stage.chain}' {what}, and it fails closed, so the "
        "request was refused; retry shortly.",
        type="service_unavailable_error",
        code="stage_unavailable",
    )


class Remote(Stage):
    """Work done by a CPU pool's engine (routing/proxy/pipeline/remote.py) with the stage's instruction
    as the system message: before generation its reply replaces the last user message (or the prompt);
    after generation it replaces each choice's answer, which the relay holds until complete.

    The request's prompt tokens (limits, routing) are counted on the client's prompt, before a
    pre-stage rewrites it; the engine's usage, which accounting prefers, counts the rewritten one.
    """

    kind = "remote"

    def __init__(self, spec: StageSpec, chain: str, *, post: bool) -> None:
        super().__init__(spec, chain)
        config = spec.config
        self.pool: str = config["pool"]
        self.instruction: str = config["instruction"]
        self.timeout_s = config.get("timeout_ms", DEFAULT_REMOTE_TIMEOUT_MS) / 1000
        self.fail_open = config.get("on_failure", "open") == "open"
        self.max_tokens: int = config.get("max_tokens", DEFAULT_REMOTE_MAX_TOKENS)
        self.on_answer = self.holds = post

    async def ask(self, ctx: RequestContext, svc: Services, text: str) -> str | None:
        """The CPU engine's reply to `text`; None when the call failed and the stage fails open."""
        try:
            reply = await remote.chat(
                svc, self.pool, self.messages(text), max_tokens=self.max_tokens, timeout_s=self.timeout_s
            )
        except remote.RemoteFailure as exc:
            remote_failed(ctx, self, exc, self.fail_open)
            return None
        run_of(ctx).outcomes[self.name] = "rewritten"
        return reply

    async def on_request(self, ctx: RequestContext, svc: Services) -> None:
        body = ctx.body
        assert body is not None
        messages = body.get("messages")
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"] if messages else []
        if users:
            msg = users[-1]
            content = msg.get("content")
            if isinstance(content, list):
                texts = [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
                old = "\n".join(texts)
            else:
                texts = [content] if isinstance(content, str) else []
                old = content if isinstance(content, str) else ""
        elif isinstance(body.get("prompt"), str):
            texts = [old := body["prompt"]]
        else:
            return  # nothing this stage can rewrite (token prompts, a list of prompts)
        reply = await self.ask(ctx, svc, old)
        if reply is None:
            return
        if users:
            content = users[-1].get("content")
            if isinstance(content, list):
                rest = [p for p in content if not (isinstance(p, dict) and isinstance(p.get("text"), str))]
                users[-1]["content"] = [{"type": "text", "text": reply}, *rest]
            else:
                users[-1]["content"] = reply
        else:
            body["prompt"] = reply
        # The text later stages look at (a guard, a classify rule): the rewritten one.
        parts = list(ctx.parts)
        for text in texts:
            if text in parts:
                parts.remove(text)
        ctx.parts = [*parts, reply]

    async def rewrite(self, ctx: RequestContext, svc: Services, text: str) -> str:
        reply = await self.ask(ctx, svc, text)
        return text if reply is None else reply

    async def open_rewrite(
        self, ctx: RequestContext, svc: Services, text: str
    ) -> tuple[str, AsyncGenerator[str, None]] | None:
        """A streamed rewrite of `text`: its first piece and the pieces still to come; None when the
        call failed before its first piece and the stage fails open (failing closed raises the 503)."""
        pieces = remote.chat_stream(
            svc, self.pool, self.messages(text), max_tokens=self.max_tokens, timeout_s=self.timeout_s
        )
        try:
            first = await anext(pieces, "")
        except remote.RemoteFailure as exc:
            remote_failed(ctx, self, exc, self.fail_open)
            return None
        run_of(ctx).outcomes[self.name] = "rewritten"
        return first, pieces

    def messages(self, text: str) -> list[dict[str, Any]]:
        return [{"role": "system", "content": self.instruction}, {"role": "user", "content": text}]


# How much of the prompt a model classifier reads (its end: the latest turn matters most).
MAX_CLASSIFY_CHARS = 4000


class ModelClassify(Classify):
    """Classify with a small model on a CPU pool when no rule matched: the model labels the prompt
    (temperature 0, a few tokens), and the label's pool serves it. No label in the reply, or a failed
    call that fails open, leaves the generate step's pool."""

    def __init__(self, spec: StageSpec, chain: str) -> None:
        super().__init__(spec, chain)
        model = spec.config["model"]
        self.model_pool: str = model["pool"]
        self.labels: dict[str, tuple[str, str]] = {
            label.lower(): (label, pool) for label, pool in model["labels"].items()
        }
        self.timeout_s = model.get("timeout_ms", DEFAULT_REMOTE_TIMEOUT_MS) / 1000
        self.fail_open = model.get("on_failure", "open") == "open"
        self.max_tokens: int = model.get("max_tokens", DEFAULT_LABEL_MAX_TOKENS)
        instruction = model.get("instruction", "")
        self.system = (instruction.strip() + "\n\n" if instruction.strip() else "") + (
            f"Label the user's message with exactly one of these labels: {', '.join(model['labels'])}. "
            "Answer with the label only."
        )
        # The first label the reply names (longest first, so "code-review" wins over "code").
        self.find = re.compile(
            r"(?<![\w-])(?:"
            + "|".join(re.escape(label) for label in sorted(self.labels, key=len, reverse=True))
            + r")(?![\w-])",
            re.IGNORECASE,
        )

    async def on_request(self, ctx: RequestContext, svc: Services) -> None:
        await super().on_request(ctx, svc)
        run = run_of(ctx)
        if self.name in run.outcomes:
            return  # a rule matched: no model call
        messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": "\n".join(ctx.parts)[-MAX_CLASSIFY_CHARS:]},
        ]
        try:
            reply = await remote.chat(
                svc,
                self.model_pool,
                messages,
                max_tokens=self.max_tokens,
                timeout_s=self.timeout_s,
                temperature=0.0,
            )
        except remote.RemoteFailure as exc:
            remote_failed(ctx, self, exc, self.fail_open)
            return
        found = self.find.search(reply)
        if found is None:
            run.outcomes[self.name] = "no label"
            return
        label, pool = self.labels[found.group(0).lower()]
        run.pool = pool
        run.outcomes[self.name] = f"label {label} -> {pool}"


def format_mismatch(problem: str) -> ProxyError:
    """The answer is not what the client's response_format asked for: the engine (the gateway's
    upstream) gave an invalid answer, so a 502; openai clients retry 5xx, which samples again."""
    return ProxyError(
        502,
        f"The model's answer does not match the requested response_format: {problem}. "
        "Retry, or make the prompt ask for that format more plainly.",
        type="server_error",
        code="response_format_mismatch",
    )


class Schema(Stage):
    """The output check of `response_format` (json_object, json_schema), on the complete answer of each
    choice (routing/proxy/responseformat.py says what is checked).

    A stream cannot take back text it has sent: by default the text streams as it comes and a failed
    check ends the stream with an error event before `[DONE]` (as vLLM reports errors found after a
    stream began); with `"hold": true` a choice's text is held until it is checked and goes out with
    its last chunk. Requests without a response_format pass untouched.
    """

    kind = "schema"
    on_answer = True

    def __init__(self, spec: StageSpec, chain: str) -> None:
        super().__init__(spec, chain)
        self.hold = bool(spec.config.get("hold", False))

    def _state(self, ctx: RequestContext) -> tuple[responseformat.Checker, dict[int, list[str]]] | None:
        run = run_of(ctx)
        if self.name in run.state:
            found: tuple[responseformat.Checker, dict[int, list[str]]] | None = run.state[self.name]
            return found
        assert ctx.body is not None
        check = responseformat.checker(ctx.body)
        state: tuple[responseformat.Checker, dict[int, list[str]]] | None = (
            None if check is None else (check, {})
        )
        run.state[self.name] = state
        return state

    def on_text(self, ctx: RequestContext, index: int, text: str) -> str:
        state = self._state(ctx)
        if state is None or not text:
            return text
        state[1].setdefault(index, []).append(text)
        return "" if self.hold else text

    def on_end(self, ctx: RequestContext, index: int) -> str:
        state = self._state(ctx)
        if state is None:
            return ""
        check, texts = state
        text = "".join(texts.pop(index, ()))
        problem = check.problem(text)
        run = run_of(ctx)
        if problem is not None:
            run.outcomes[self.name] = "invalid"
            raise format_mismatch(problem)
        run.outcomes.setdefault(self.name, "pass")
        return text if self.hold else ""


def build(spec: StageSpec, chain: str, *, post: bool) -> Stage:
    if spec.kind == "guard":
        return Guard(spec, chain, post=post)
    if spec.kind == "classify":
        return ModelClassify(spec, chain) if spec.config.get("model") else Classify(spec, chain)
    if spec.kind == "cache":
        return Cache(spec, chain)
    if spec.kind == "remote":
        return Remote(spec, chain, post=post)
    if spec.kind == "schema":
        return Schema(spec, chain)
    raise ValueError(f"no stage of kind {spec.kind!r}")  # stagespec.KINDS and this list move together


class Chain:
    """A chain's stage objects, built once per chain version."""

    __slots__ = ("answer", "holds", "name", "pool", "post", "pre", "reason", "respond")

    def __init__(self, spec: ChainSpec) -> None:
        self.name = spec.name
        self.pre = tuple(build(s, spec.name, post=False) for s in spec.pre)
        self.post = tuple(build(s, spec.name, post=True) for s in spec.post)
        self.answer = tuple(s for s in self.post if s.on_answer)
        # Whose response hook runs once the answer is out: every post-stage, and the pre-stages that
        # have one (a cache stage stores the answer it missed).
        self.respond = (*self.post, *(s for s in self.pre if type(s).on_response is not Stage.on_response))
        self.holds = any(s.holds for s in self.answer)
        pool = spec.generate.config.get("pool")
        self.pool: str | None = pool if isinstance(pool, str) and pool else None
        self.reason = f"chain {spec.name} v{spec.version}"


def select(ctx: RequestContext, svc: Services) -> None:
    """The request's chain (tenant's for the alias, tenant's, alias's), if any, onto the context."""
    assert ctx.key is not None
    spec = svc.snapshot.chain_for(ctx.key.tenant_id, ctx.alias)
    if spec is None:
        return
    built: dict[tuple[str, int], Chain] = svc.chains
    chain = built.get((spec.name, spec.version))
    if chain is None:
        if len(built) > 1000:
            built.clear()
        chain = built[spec.name, spec.version] = Chain(spec)
    ctx.chain = chain
    ctx.stage_run = StageRun()


def _record(ctx: RequestContext, stage: Stage, hook: str, started: float) -> None:
    took = time.perf_counter() - started
    stage.seconds_of(hook).observe(took)
    spent = run_of(ctx).took
    spent[stage.name] = spent.get(stage.name, 0.0) + took


def _failed(stage: Stage, exc: Exception) -> ProxyError:
    log.exception("proxy: stage %s of chain %s failed", stage.name, stage.chain, exc_info=exc)
    return ProxyError(
        500,
        f"The stage '{stage.name}' of the chain '{stage.chain}' failed; the request was not completed.",
        type="server_error",
        code="stage_failed",
    )


async def pre(ctx: RequestContext, svc: Services) -> None:
    assert ctx.chain is not None
    for stage in ctx.chain.pre:
        await _run_hook(ctx, stage, "request", stage.on_request(ctx, svc))


async def _run_hook(ctx: RequestContext, stage: Any, hook: str, call: Awaitable[None]) -> None:
    """Await one stage's request or response hook: its outcome and time recorded, an unexpected
    error turned into the request's `stage_failed` answer naming the stage."""
    started = time.perf_counter()
    try:
        await call
    except ProxyError:
        run_of(ctx).outcomes.setdefault(stage.name, "refused")
        raise
    except Exception as exc:
        run_of(ctx).outcomes[stage.name] = "error"
        raise _failed(stage, exc) from exc
    finally:
        _record(ctx, stage, hook, started)


def answer_text(ctx: RequestContext, index: int, text: str | None) -> str:
    """`text` (None: the choice's end) through every answer stage, in chain order."""
    assert ctx.chain is not None
    out = text or ""
    for stage in ctx.chain.answer:
        out = _through(ctx, stage, index, out, text is None)
    return out


def through(ctx: RequestContext, answer: Sequence[Stage], index: int, text: str, end: bool) -> str:
    """`text` through the answer stages `answer` in order (with their `on_end` at the choice's end)."""
    for stage in answer:
        text = _through(ctx, stage, index, text, end)
    return text


def _through(ctx: RequestContext, stage: Stage, index: int, text: str, end: bool) -> str:
    """One answer stage's `on_text` (and `on_end` at the choice's end), timed, errors mapped."""
    started = time.perf_counter()
    try:
        out = stage.on_text(ctx, index, text)
        if end:
            out += stage.on_end(ctx, index)
        return out
    except ProxyError:
        run_of(ctx).outcomes.setdefault(stage.name, "refused")
        raise
    except Exception as exc:
        run_of(ctx).outcomes[stage.name] = "error"
        raise _failed(stage, exc) from exc
    finally:
        run_of(ctx).spent[stage.name] = run_of(ctx).spent.get(stage.name, 0.0) + time.perf_counter() - started


async def held_text(
    ctx: RequestContext, svc: Services, index: int, text: str, answer: Sequence[Stage] | None = None
) -> str:
    """A held answer's whole text (choice `index`) through the answer stages (`answer`, by default all
    of them) in chain order: a holding stage rewrites it (`rewrite`), the others see it as one piece
    (`on_text` and `on_end`)."""
    assert ctx.chain is not None
    out = text
    for stage in ctx.chain.answer if answer is None else answer:
        if not stage.holds:
            out = _through(ctx, stage, index, out, True)
            continue
        started = time.perf_counter()
        try:
            out = await stage.rewrite(ctx, svc, out)
        except ProxyError:
            run_of(ctx).outcomes.setdefault(stage.name, "refused")
            raise
        except Exception as exc:
            run_of(ctx).outcomes[stage.name] = "error"
            raise _failed(stage, exc) from exc
        finally:
            run_of(ctx).spent[stage.name] = (
                run_of(ctx).spent.get(stage.name, 0.0) + time.perf_counter() - started
            )
    return out


async def post(ctx: RequestContext, svc: Services) -> None:
    assert ctx.chain is not None
    for stage in ctx.chain.respond:
        await _run_hook(ctx, stage, "response", stage.on_response(ctx, svc))


def account(ctx: RequestContext) -> str:
    """Per-stage outcomes into Prometheus; what the request log says about the chain."""
    chain = ctx.chain
    assert chain is not None
    for stage in (*chain.pre, *chain.post):
        outcome = run_of(ctx).outcomes.get(stage.name, "pass")
        stage.outcome_of(outcome).inc()
        spent = run_of(ctx).spent.get(stage.name)
        if spent is not None:
            stage.seconds_of("chunks").observe(spent)
    notes = [f"{name} {outcome}" for name, outcome in run_of(ctx).outcomes.items() if outcome != "pass"]
    return chain.reason + (f" ({', '.join(notes)})" if notes else "")


def columns(ctx: RequestContext) -> list[dict[str, Any]]:
    """The request log's `stages` column: per stage (chain order) its name, kind, outcome and the
    milliseconds its hooks took; "not run" for a stage the request never reached."""
    chain = ctx.chain
    assert chain is not None
    run = run_of(ctx)
    out: list[dict[str, Any]] = []
    for stage in (*chain.pre, *chain.post):
        name = stage.name
        took, spent = run.took.get(name), run.spent.get(name)
        if took is None and spent is None and name not in run.outcomes:
            outcome = "not run"
        else:
            outcome = run.outcomes.get(name, "pass")
        ms = ((took or 0.0) + (spent or 0.0)) * 1000
        out.append({"name": name, "kind": stage.kind, "outcome": outcome, "ms": round(ms, 3)})
    return out
