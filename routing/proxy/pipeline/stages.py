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
from collections.abc import Awaitable
from typing import Any

from routing.proxy import metrics as m
from routing.proxy import responseformat
from routing.proxy.config import ChainSpec
from routing.proxy.errors import ProxyError
from routing.proxy.pipeline.context import RequestContext, StageRun
from routing.proxy.services import Services
from routing.proxy.stagespec import StageSpec, guard_pattern

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
        for rule in spec.config["rules"]:
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
        for n, (match, pattern, pool) in enumerate(self.rules):
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
        return Classify(spec, chain)
    if spec.kind == "schema":
        return Schema(spec, chain)
    raise ValueError(f"no stage of kind {spec.kind!r}")  # stagespec.KINDS and this list move together


class Chain:
    """A chain's stage objects, built once per chain version."""

    __slots__ = ("answer", "name", "pool", "post", "pre", "reason")

    def __init__(self, spec: ChainSpec) -> None:
        self.name = spec.name
        self.pre = tuple(build(s, spec.name, post=False) for s in spec.pre)
        self.post = tuple(build(s, spec.name, post=True) for s in spec.post)
        self.answer = tuple(s for s in self.post if s.on_answer)
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
    stage.seconds_of(hook).observe(time.perf_counter() - started)


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
        started = time.perf_counter()
        try:
            out = stage.on_text(ctx, index, out)
            if text is None:
                out += stage.on_end(ctx, index)
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
    for stage in ctx.chain.post:
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
