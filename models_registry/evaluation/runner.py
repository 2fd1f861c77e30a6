"""Running an evaluation: every case of a suite version through both sides, scored and stored one by one.

`execute_run(run_id)` is what the Celery task `models_registry.run_evaluation` calls. It is idempotent and
resumable:

- a Redis lock per run lets only one worker execute it at a time (another delivery returns at once);
  the lock expires by itself when its worker dies, so a redelivered or re-sent task takes over;
- the cases to do are those without a sample, so a resumed run repeats only what was lost; a sample is
  written the moment its case is scored, and the (run, case) unique constraint refuses a second one;
- between cases the run's `cancel_requested` flag is read; once it is set no case starts, the ones in
  flight are abandoned, and the run ends `cancelled` with the samples it has.

The HTTP side runs on an asyncio loop in a helper thread (aiohttp, bounded concurrency per side); the
calling thread keeps every database write and the live progress pushes. Per case:

1. both sides generate from the case's messages on `/v1/chat/completions`: temperature 0, the run's
   seed and max_tokens, `logprobs` + `top_logprobs`, `return_token_ids`, streamed (for the TTFT);
2. teacher forcing: the candidate scores the reference's own tokens on `/v1/completions` with
   `prompt = prompt_token_ids + token_ids`, `max_tokens: 1`, `prompt_logprobs: k` (vLLM, the
   simulator). An engine that returns no token ids and takes only text prompts (llama.cpp's server) is
   sent the prompt text rebuilt with the model's chat template plus the reference's output: on our
   route `/inferchain/v1/token_logprobs` where the engine process serves it (the fleet's llama.cpp
   engines: nodes/engines/llamacpp_server.py), whose listings are keyed by token id, else with
   `echo: true, logprobs: k` (listings keyed by token text), and the output's listings are read back. If
   neither works,
   the run notes why once and the KL falls back to the free-running top-k comparison, labelled so in
   every sample (docs/evaluations.md, "Distributions"). The reference scores its own output the same
   way, so both sides' distributions come with the same k: `EVAL_KL_TOP_K` (20; -1, the whole
   vocabulary), or the largest k the engine allows when it refuses that (vLLM's `--max-logprobs`, read
   from its 400); listings that hold (all but 0.001 of) both distributions make the KL exact;
3. score_sample() and the timings make the sample row.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import queue
import re
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from core.live import push_live_event
from core.redis_client import get_redis, key
from models_registry.chat_template import ChatTemplate, gguf_chat_template
from models_registry.choices import SourceKind
from models_registry.evaluation.endpoints import Endpoint, EndpointUnavailable, deployment_endpoint
from models_registry.evaluation.metrics import (
    SideOutput,
    TopK,
    listing_from_chat,
    listing_from_completion,
    listing_from_prompt_logprobs,
    score_sample,
    summarize,
)
from models_registry.evaluation.models import EvalCase, EvalRun, EvalSample, RunState
from models_registry.models import ModelVersion

log = logging.getLogger(__name__)

LOCK_SECONDS = 15  # a dead worker's lock lapses after this; a live one renews it every quarter
PROGRESS_INTERVAL = 0.25  # at most this often a progress event per run (plus the last one)
RETRIES = 2  # more tries of a side's request after a connection error or a 5xx


def run_group(run_id: int) -> str:
    """The live group a run's progress is pushed to (browsers subscribe to it)."""
    return f"live.evalrun.{run_id}"


# -- one side's HTTP calls --------------------------------------------------------------------------------


class SideError(Exception):
    """A side's request failed for good (after retries), or answered something unreadable."""


class TeacherForcingUnavailable(Exception):
    """The candidate engine cannot score a given text (no prompt_logprobs or no token ids)."""


class TeacherForcingMismatch(TeacherForcingUnavailable):
    """This one sample's text could not be scored position by position (its tokens came back split
    differently); the sample falls back to the free-running comparison, the run keeps teacher forcing."""


@dataclass
class Generation:
    text: str
    tokens: list[str]
    token_logprobs: list[float]
    listings: list[dict[str, float]] | None
    prompt_token_ids: list[int] | None
    token_ids: list[int] | None
    latency_ms: float
    ttft_ms: float | None
    completion_tokens: int

    def output(self) -> SideOutput:
        return SideOutput(text=self.text, tokens=self.tokens, top_logprobs=self.listings)

    @property
    def tokens_per_s(self) -> float | None:
        return self.completion_tokens / (self.latency_ms / 1000) if self.latency_ms > 0 else None


async def _post(
    session: aiohttp.ClientSession, ep: Endpoint, path: str, body: dict[str, Any], timeout: float
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {ep.api_key}"} if ep.api_key else {}
    last: Exception | None = None
    for attempt in range(RETRIES + 1):
        try:
            async with session.post(
                ep.base_url.rstrip("/") + path,
                json=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as resp:
                status = resp.status
                try:
                    data = await resp.json(content_type=None)
                except ValueError:
                    data = {"error": {"message": (await resp.text())[:500]}}
                if status >= 500 and attempt < RETRIES:
                    last = SideError(f"{path}: HTTP {status}")
                    await asyncio.sleep(0.2 * (attempt + 1))
                    continue
                return status, data
        except (aiohttp.ClientError, TimeoutError) as exc:
            last = exc
            if attempt < RETRIES:
                await asyncio.sleep(0.2 * (attempt + 1))
    raise SideError(f"{path}: {type(last).__name__}: {last}")


def _error_message(data: Any) -> str:
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        return str(data["error"].get("message", ""))[:500]
    return str(data)[:500]


async def generate(
    session: aiohttp.ClientSession, ep: Endpoint, run: RunParams, messages: list[dict[str, str]]
) -> Generation:
    """One greedy generation on /v1/chat/completions, streamed so the time to the first token shows.

    The stream carries each token's logprobs and (vLLM's `return_token_ids`) its id, the first chunk the
    prompt's token ids; the final chunk the usage.
    """
    body: dict[str, Any] = {
        "model": ep.model,
        "messages": messages,
        # Greedy as this engine means it (EvalRun.greedy): temperature 0 and every penalty neutral.
        **(ep.greedy or {"temperature": 0}),
        "seed": run.seed,
        "max_tokens": run.max_tokens,
        "return_token_ids": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if run.top_logprobs > 0:
        body["logprobs"] = True
        body["top_logprobs"] = run.top_logprobs
    headers = {"Authorization": f"Bearer {ep.api_key}"} if ep.api_key else {}
    text_parts: list[str] = []
    content: list[dict[str, Any]] = []
    token_ids: list[int] | None = None
    prompt_ids: list[int] | None = None
    usage: dict[str, Any] = {}
    ttft_ms: float | None = None
    last: Exception | None = None
    for attempt in range(RETRIES + 1):
        text_parts, content, token_ids, prompt_ids, usage, ttft_ms = [], [], None, None, {}, None
        started = time.perf_counter()
        try:
            async with session.post(
                ep.base_url.rstrip("/") + "/v1/chat/completions",
                json=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=run.timeout),
            ) as resp:
                if resp.status != 200:
                    try:
                        data = await resp.json(content_type=None)
                    except ValueError:
                        data = {"error": {"message": (await resp.text())[:500]}}
                    if resp.status >= 500 and attempt < RETRIES:
                        last = SideError(f"HTTP {resp.status}: {_error_message(data)}")
                        await asyncio.sleep(0.2 * (attempt + 1))
                        continue
                    raise SideError(f"HTTP {resp.status}: {_error_message(data)}")
                async for raw in resp.content:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        break
                    chunk = json.loads(payload)
                    if isinstance(chunk.get("prompt_token_ids"), list):
                        prompt_ids = list(chunk["prompt_token_ids"])
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    for choice in chunk.get("choices") or []:
                        piece = (choice.get("delta") or {}).get("content") or ""
                        items = (choice.get("logprobs") or {}).get("content") or []
                        ids = choice.get("token_ids")
                        if ttft_ms is None and (piece or items or ids):
                            ttft_ms = (time.perf_counter() - started) * 1000
                        text_parts.append(piece)
                        content.extend(items)
                        if isinstance(ids, list):
                            token_ids = (token_ids or []) + list(ids)
            break
        except (aiohttp.ClientError, TimeoutError) as exc:
            last = exc
            if attempt < RETRIES:
                await asyncio.sleep(0.2 * (attempt + 1))
                continue
            raise SideError(f"/v1/chat/completions: {type(exc).__name__}: {exc}") from exc
        except (ValueError, TypeError, AttributeError) as exc:
            raise SideError(f"unreadable chat completion stream: {type(exc).__name__}: {exc}") from exc
    else:
        raise SideError(f"/v1/chat/completions: {last}")
    latency_ms = (time.perf_counter() - started) * 1000
    text = "".join(text_parts)
    try:
        tokens = [str(item["token"]) for item in content]
        token_logprobs = [float(item["logprob"]) for item in content]
        listings: list[dict[str, float]] | None = [listing_from_chat(item) for item in content] or None
    except (KeyError, TypeError, ValueError) as exc:
        raise SideError(f"unreadable logprobs: {type(exc).__name__}: {exc}") from exc
    if not tokens:
        # No logprobs from this engine: compare whitespace-separated words instead of tokens.
        tokens = text.split()
    if token_ids is not None and len(token_ids) != len(content):
        token_ids = None  # ids that do not line up with the tokens cannot be scored
    return Generation(
        text=text,
        tokens=tokens,
        token_logprobs=token_logprobs,
        listings=listings,
        prompt_token_ids=prompt_ids,
        token_ids=token_ids,
        latency_ms=latency_ms,
        ttft_ms=ttft_ms,
        completion_tokens=int(usage.get("completion_tokens") or len(tokens)),
    )


_MAX_ALLOWED = re.compile(r"greater than max allowed: (-?\d+)")


def max_allowed_k(data: Any) -> int | None:
    """The k an engine says it allows, from vLLM's refusal ("Requested prompt logprobs of 128256, which
    is greater than max allowed: 20", sampling_params.py _validate_logprobs); None in any other answer."""
    found = _MAX_ALLOWED.search(_error_message(data))
    return int(found.group(1)) if found else None


@dataclass
class Forced:
    """One side's distributions at every position of the reference's output, and the k they were asked
    for (-1: the whole vocabulary)."""

    listings: list[dict[Any, float]]  # keyed by token text (or by id when ids_only)
    k: int
    # The same listings keyed by token id, where the engine gives ids (prompt_logprobs, our llama.cpp
    # route): two tokens that decode to the same text stay two tokens, so whole-vocabulary listings give
    # the exact KL.
    by_id: list[dict[int, float]] | None = None
    # The ids of the scored tokens, where the engine names them (None: the reference's own token_ids).
    token_ids: list[int] | None = None
    # The engine gave listings by id only (`listings` is `by_id`): they compare only with listings by id.
    ids_only: bool = False


async def _post_listing(
    session: aiohttp.ClientSession, ep: Endpoint, run: RunParams, body: dict[str, Any], field: str, k: int
) -> tuple[int, Any, int]:
    """POST /v1/completions asking for k listed tokens in `field`; when the engine refuses that k and
    says which it allows, once more with that, and that k is asked of this engine from then on.
    Returns (status, body, the k the answer has)."""
    learnt = run.allowed_k.get(ep.base_url)
    if learnt is not None:
        k = learnt
    body[field] = k
    status, data = await _post(session, ep, "/v1/completions", body, run.timeout)
    allowed = max_allowed_k(data) if status == 400 else None
    if allowed is not None and allowed > 0 and allowed != k:
        body[field] = k = run.allowed_k[ep.base_url] = allowed
        status, data = await _post(session, ep, "/v1/completions", body, run.timeout)
    return status, data, k


async def score_reference_text(
    session: aiohttp.ClientSession, ep: Endpoint, run: RunParams, reference: Generation
) -> Forced:
    """An engine's distribution at each position of the reference's output (teacher forcing)."""
    if reference.prompt_token_ids is None or reference.token_ids is None:
        raise TeacherForcingUnavailable("the reference engine returns no token ids (return_token_ids)")
    if not reference.token_ids:
        return Forced([], run.kl_top_k)
    start = len(reference.prompt_token_ids)
    body = {
        "model": ep.model,
        "prompt": reference.prompt_token_ids + reference.token_ids,
        "max_tokens": 1,
        "temperature": 0,
    }
    status, data, k = await _post_listing(session, ep, run, body, "prompt_logprobs", run.kl_top_k)
    if 400 <= status < 500:
        raise TeacherForcingUnavailable(
            f"the candidate engine refused prompt_logprobs (HTTP {status}: {_error_message(data)})"
        )
    if status != 200:
        raise SideError(f"teacher forcing: HTTP {status}: {_error_message(data)}")
    try:
        entries = data["choices"][0].get("prompt_logprobs")
    except (KeyError, IndexError, TypeError) as exc:
        raise SideError(f"unreadable completion: {exc}") from exc
    if not isinstance(entries, list):
        raise TeacherForcingUnavailable("the candidate engine returns no prompt_logprobs")
    forced = entries[start:]
    if len(forced) != len(reference.token_ids) or any(not isinstance(e, dict) for e in forced):
        raise TeacherForcingUnavailable(
            "the candidate's prompt_logprobs do not line up with the reference's tokens"
        )
    return Forced(
        [listing_from_prompt_logprobs(e) for e in forced],
        k,
        by_id=[{int(tok): float(v["logprob"]) for tok, v in e.items()} for e in forced],
        token_ids=list(reference.token_ids),
    )


# Our route on the llama.cpp engine process (nodes/engines/llamacpp_server.py): next-token logprobs keyed
# by token id. An engine without it (a plain llama_cpp.server) answers 404.
TOKEN_LOGPROBS_PATH = "/inferchain/v1/token_logprobs"


class _NoTokenLogprobsRoute(Exception):
    """The engine does not serve TOKEN_LOGPROBS_PATH."""


async def score_reference_text_by_token_ids(
    session: aiohttp.ClientSession,
    ep: Endpoint,
    run: RunParams,
    reference: Generation,
    messages: list[dict[str, str]],
) -> Forced:
    """Teacher forcing on a llama.cpp engine launched by the fleet (our route, keyed by token id).

    The engine gets the same text as the echo path (the prompt its chat template builds, then the
    reference's output) and answers, for each of the output's m tokens, the distribution predicting it
    from the model's logits (temperature 1), keyed by token id: the top k, or the whole vocabulary with
    k = -1, plus the tail mass. The tokens it read must be the reference's tokens again (by text, as the
    reference's chat response names them), else this sample is not scored so.
    """
    template = ep.chat_template
    if template is None:
        raise TeacherForcingUnavailable("the candidate's chat template is unknown")
    m = len(reference.tokens)
    k = run.kl_top_k
    if m == 0:
        return Forced([], k, by_id=[], token_ids=[], ids_only=True)
    try:
        prompt = template.render(messages)
    except Exception as exc:  # model-supplied template code
        raise TeacherForcingUnavailable(f"the candidate's chat template does not render: {exc}") from exc
    body = {"model": ep.model, "prompt": prompt + reference.text, "last": m, "top_k": k}
    status, data = await _post(session, ep, TOKEN_LOGPROBS_PATH, body, run.timeout)
    if status in (404, 405):
        raise _NoTokenLogprobsRoute
    if 400 <= status < 500:
        raise TeacherForcingUnavailable(
            f"the candidate engine refused {TOKEN_LOGPROBS_PATH} (HTTP {status}: {_error_message(data)})"
        )
    if status != 200:
        raise SideError(f"teacher forcing: HTTP {status}: {_error_message(data)}")
    try:
        positions = list(data["positions"])
        listed = [str(p["token"]) for p in positions]
        ids = [int(p["token_id"]) for p in positions]
        by_id = [{int(t): float(lp) for t, lp in p["top_logprobs"].items()} for p in positions]
        whole = bool(data.get("whole_vocabulary"))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SideError(f"unreadable token logprobs: {type(exc).__name__}: {exc}") from exc
    if listed != reference.tokens:
        raise TeacherForcingMismatch(
            "the reference's output came back as other tokens when the candidate read it as text "
            f"({len(listed)} of {m} listed; first {listed[:3]!r} vs {reference.tokens[:3]!r})"
        )
    return Forced(by_id, -1 if whole else k, by_id=by_id, token_ids=ids, ids_only=True)


def echo_rows_aligned(template: ChatTemplate, prompt: str) -> bool:
    """Whether llama-cpp-python's echoed listing i is the distribution that predicts token i.

    Its `_create_completion` (0.3.x, pinned in pyproject.toml) lists echoed tokens with the logits rows
    in order but drops a leading BOS token from the tokens only: when the prompt begins with BOS (the
    model adds one, or the template writes it as its first token) listing i predicts token i; otherwise
    listing i is the row after token i, which predicts token i + 1.
    """
    return template.add_bos or bool(template.bos_token and prompt.startswith(template.bos_token))


async def score_reference_text_by_echo(
    session: aiohttp.ClientSession,
    ep: Endpoint,
    run: RunParams,
    reference: Generation,
    messages: list[dict[str, str]],
) -> Forced:
    """Teacher forcing where the engine takes text prompts only (llama.cpp's server, no token ids).

    The candidate gets the prompt text its chat template builds for the case's messages, followed by the
    reference's output, with `echo: true, logprobs: k, max_tokens: 1`: the response lists every token of
    that text with its top-k, then the generated token (if it did not end the text). The output's tokens
    must be the reference's tokens again (same text, same tokenizer), else this sample is not scored so.
    """
    template = ep.chat_template
    if template is None:
        raise TeacherForcingUnavailable("the candidate's chat template is unknown")
    m = len(reference.tokens)
    # llama-cpp-python lists as many as asked (no cap): the whole vocabulary is the GGUF's token count.
    k = run.kl_top_k
    if template.vocab_size and (k < 0 or k > template.vocab_size):
        k = template.vocab_size
    elif k < 0:
        k = run.top_logprobs
    if m == 0:
        return Forced([], k)
    try:
        prompt = template.render(messages)
    except Exception as exc:  # model-supplied template code
        raise TeacherForcingUnavailable(f"the candidate's chat template does not render: {exc}") from exc
    body = {
        "model": ep.model,
        "prompt": prompt + reference.text,
        "max_tokens": 1,
        "temperature": 0,
        "echo": True,
    }
    status, data, k = await _post_listing(session, ep, run, body, "logprobs", k)
    if 400 <= status < 500:
        raise TeacherForcingUnavailable(
            f"the candidate engine refused echo with logprobs (HTTP {status}: {_error_message(data)})"
        )
    if status != 200:
        raise SideError(f"teacher forcing: HTTP {status}: {_error_message(data)}")
    try:
        logprobs = data["choices"][0].get("logprobs") or {}
        tokens = [str(t) for t in logprobs.get("tokens") or []]
        tops = list(logprobs.get("top_logprobs") or [])
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise SideError(f"unreadable completion: {exc}") from exc
    if not tokens or len(tops) != len(tokens):
        raise TeacherForcingUnavailable("the candidate engine returns no logprobs for an echoed prompt")
    if echo_rows_aligned(template, prompt):
        # ... text tokens, then the generated token when there is one (none when the candidate ends the
        # text there: an end-of-sequence token is not listed): the output is the m tokens before it.
        end = len(tokens) - min(1, int((data.get("usage") or {}).get("completion_tokens", 1)))
        listed, rows = tokens[end - m : end], tops[end - m : end]
    else:
        # ... text tokens, the generated one not listed; the row predicting token i sits at i - 1.
        listed, rows = tokens[-m:], tops[-1 - m : -1]
    if listed != reference.tokens or len(rows) != m or any(not isinstance(r, dict) for r in rows):
        raise TeacherForcingMismatch(
            "the reference's output came back as other tokens when the candidate read it as text "
            f"({len(listed)} of {m} listed; first {listed[:3]!r} vs {reference.tokens[:3]!r})"
        )
    # A whole-vocabulary listing reports k as -1, whatever count it was asked for.
    whole = template.vocab_size and k >= template.vocab_size
    return Forced([listing_from_completion(r) for r in rows], -1 if whole else k)


async def teacher_force(
    session: aiohttp.ClientSession,
    ep: Endpoint,
    run: RunParams,
    reference: Generation,
    messages: list[dict[str, str]],
) -> Forced:
    """An engine's distributions over the reference's output: by token ids where the reference gave
    them (prompt_logprobs), else by text with that engine's chat template: through our route keyed by
    token id where the engine serves it (a llama.cpp engine the fleet launched), else by echo."""
    if reference.prompt_token_ids is not None and reference.token_ids is not None:
        return await score_reference_text(session, ep, run, reference)
    if ep.chat_template is not None:
        if ep.base_url not in run.no_token_logprobs:
            try:
                return await score_reference_text_by_token_ids(session, ep, run, reference, messages)
            except _NoTokenLogprobsRoute:
                run.no_token_logprobs.add(ep.base_url)  # a plain llama_cpp.server: echo from now on
        return await score_reference_text_by_echo(session, ep, run, reference, messages)
    raise TeacherForcingUnavailable(
        "the reference engine returns no token ids (return_token_ids), and the candidate's chat template "
        "is unknown (it is not a registered GGUF version), so its prompt cannot be rebuilt as text"
    )


# -- the async producer -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunParams:
    seed: int
    max_tokens: int
    top_logprobs: int
    concurrency: int
    timeout: float
    kl_top_k: int = 20  # the k teacher forcing asks for (-1: the whole vocabulary), EVAL_KL_TOP_K
    # base URL -> the k that engine said it allows (learnt from its first refusal, shared by the cases).
    allowed_k: dict[str, int] = field(default_factory=dict, compare=False, hash=False)
    # base URLs that do not serve TOKEN_LOGPROBS_PATH (learnt from their first 404).
    no_token_logprobs: set[str] = field(default_factory=set, compare=False, hash=False)


@dataclass(frozen=True)
class CaseJob:
    pk: int
    case_key: str
    position: int
    tags: list[str]
    messages: list[dict[str, str]]
    expected: str | None
    match_rule: str | None


@dataclass
class CaseResult:
    job: CaseJob
    reference: Generation | None = None
    candidate: Generation | None = None
    forced: Forced | None = None
    # The reference scoring its own output with the same k (None: its generation listings stand in).
    forced_reference: Forced | None = None
    forcing_note: str = ""
    error: str = ""


@dataclass
class _Shared:
    forcing_note: str = ""
    forcing_off: bool = False
    # The reference cannot score its own text: its generation's top-k stands in for every sample (the
    # summary then says top-k with that k).
    self_forcing_off: bool = False
    results: queue.Queue[CaseResult | None] = field(default_factory=queue.Queue)


async def _produce(
    jobs: Sequence[CaseJob],
    reference: Endpoint,
    candidate: Endpoint,
    params: RunParams,
    stop: threading.Event,
    shared: _Shared,
) -> None:
    ref_sem = asyncio.Semaphore(params.concurrency)
    cand_sem = asyncio.Semaphore(params.concurrency)
    # The next case starts only when a slot of each side is free, so cases run in suite order and
    # a cancel leaves no case half-started.
    gate = asyncio.Semaphore(params.concurrency)
    connector = aiohttp.TCPConnector(limit=0)

    async with aiohttp.ClientSession(connector=connector) as session:

        async def side(sem: asyncio.Semaphore, ep: Endpoint, job: CaseJob) -> Generation:
            async with sem:
                return await generate(session, ep, params, job.messages)

        async def one(job: CaseJob) -> None:
            result = CaseResult(job)
            try:
                ref_gen, cand_gen = await asyncio.gather(
                    side(ref_sem, reference, job), side(cand_sem, candidate, job)
                )
                result.reference, result.candidate = ref_gen, cand_gen
                if params.top_logprobs > 0 and ref_gen.listings is not None and not shared.forcing_off:
                    try:
                        async with cand_sem:
                            result.forced = await teacher_force(
                                session, candidate, params, ref_gen, job.messages
                            )
                    except TeacherForcingMismatch as exc:
                        result.forcing_note = str(exc)
                    except TeacherForcingUnavailable as exc:
                        shared.forcing_off = True
                        shared.forcing_note = str(exc)
                        result.forcing_note = str(exc)
                    if result.forced is not None and not shared.self_forcing_off:
                        try:
                            async with ref_sem:
                                result.forced_reference = await teacher_force(
                                    session, reference, params, ref_gen, job.messages
                                )
                        except TeacherForcingMismatch:
                            pass  # this sample compares against the reference's generation listings
                        except TeacherForcingUnavailable:
                            shared.self_forcing_off = True
            except SideError as exc:
                result.error = str(exc)
            finally:
                gate.release()
            if not stop.is_set():
                shared.results.put(result)

        tasks: list[asyncio.Task[None]] = []
        for job in jobs:
            await gate.acquire()
            if stop.is_set():
                gate.release()
                break
            tasks.append(asyncio.create_task(one(job)))
        while tasks and not stop.is_set():
            _done, pending = await asyncio.wait(tasks, timeout=0.05)
            tasks = list(pending)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# -- storing and summarising ------------------------------------------------------------------------------


def sample_from_result(run: EvalRun, result: CaseResult) -> EvalSample:
    job = result.job
    sample = EvalSample(run=run, case_id=job.pk, case_key=job.case_key, position=job.position, tags=job.tags)
    ref, cand = result.reference, result.candidate
    if result.error or ref is None or cand is None:
        sample.error = result.error or "no output"
        return sample
    cand_forced = result.forced
    forced: Sequence[TopK] | None = cand_forced.listings if cand_forced is not None else None
    forced_ref_listings: Sequence[TopK] | None = None
    forced_ref = result.forced_reference
    if forced is not None and forced_ref is not None and len(forced_ref.listings) != len(forced):
        forced_ref = None  # the two sides read the text as different tokens: generation listings instead
    forced_tokens: list[Any] | None = None
    if cand_forced is not None and cand_forced.by_id is not None and forced_ref is not None:
        ids = forced_ref.token_ids if forced_ref.token_ids is not None else ref.token_ids
        if (
            forced_ref.by_id is not None
            and ids is not None
            and len(ids) == len(forced_ref.by_id)
            and (cand_forced.token_ids is None or cand_forced.token_ids == ids)
        ):
            # Both sides scored the same token ids by id: compare by id (the token texts may repeat).
            forced, forced_ref_listings = cand_forced.by_id, forced_ref.by_id
            forced_tokens = list(ids)
    if forced_tokens is None:
        # Listings keyed by id only do not compare with listings by text (the other side's, or the
        # reference's generation listings): the reference's then stand in, the candidate's go unused.
        if forced_ref is not None and forced_ref.ids_only:
            forced_ref = None
        if cand_forced is not None and cand_forced.ids_only:
            forced = None
            if not result.forcing_note:
                result.forcing_note = (
                    "the candidate listed its distributions by token id and the reference by token text "
                    "(or not the same token ids): this sample compares the free-running top-k"
                )
        forced_ref_listings = forced_ref.listings if forced_ref is not None else None
    kl_k = None
    if forced is not None and cand_forced is not None:
        # The smaller k of the two sides' listings (-1, the whole vocabulary, only when both are whole).
        ks = [cand_forced.k, forced_ref.k if forced_ref is not None else run.top_logprobs]
        kl_k = -1 if all(k < 0 for k in ks) else min(k for k in ks if k >= 0)
    score = score_sample(
        ref.output(),
        cand.output(),
        expected=job.expected,
        match_rule=job.match_rule,
        candidate_scored_reference=forced,
        reference_scored_reference=forced_ref_listings,
        kl_k=kl_k,
        forced_tokens=forced_tokens,
        keep_positions=True,
    )
    # Stored on the sample row for the side-by-side view and the run's KL quantiles, not in the scores.
    per_position: list[float] = score.pop("position_kl")
    if result.forcing_note and forced is None:
        score["kl_note"] = result.forcing_note  # why this sample's KL is the free-running one
    sample.reference_output = ref.text
    sample.candidate_output = cand.text
    sample.reference_tokens = ref.tokens
    sample.candidate_tokens = cand.tokens
    sample.reference_token_logprobs = ref.token_logprobs
    sample.candidate_token_logprobs = cand.token_logprobs
    sample.position_kl = per_position
    sample.exact_match = score["exact_match"]
    sample.first_divergence = score["first_divergence"]
    sample.token_agreement = score["token_agreement"]
    sample.chrf = score["chrf"]
    sample.reference_correct = score["reference_correct"]
    sample.candidate_correct = score["candidate_correct"]
    sample.flip = score["flip"] or ""
    sample.kl_mode = score["kl_mode"] or ""
    sample.mean_kl = score["mean_kl"]
    sample.max_kl = score["max_kl"]
    sample.top1_agreement = score["top1_agreement"]
    sample.scores = score
    sample.reference_latency_ms = ref.latency_ms
    sample.candidate_latency_ms = cand.latency_ms
    sample.reference_ttft_ms = ref.ttft_ms
    sample.candidate_ttft_ms = cand.ttft_ms
    sample.reference_tokens_per_s = ref.tokens_per_s
    sample.candidate_tokens_per_s = cand.tokens_per_s
    return sample


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p95": None}
    ordered = sorted(values)
    return {
        "mean": statistics.fmean(ordered),
        "p50": statistics.median(ordered),
        "p95": ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))],
    }


def run_summary(run: EvalRun) -> dict[str, Any]:
    """summarize() over the run's scored samples, plus latency and tokens/s per side and the error count."""
    rows: list[dict[str, Any]] = [
        dict(r)
        for r in run.samples.filter(error="")
        .values(
            "scores",
            "reference_latency_ms",
            "candidate_latency_ms",
            "reference_tokens_per_s",
            "candidate_tokens_per_s",
            "reference_ttft_ms",
            "candidate_ttft_ms",
            "position_kl",
            "tags",
        )
        .order_by("position", "id")
    ]
    out = summarize(
        [r["scores"] for r in rows],
        position_kl=[r["position_kl"] or [] for r in rows],
        tags=[r["tags"] or [] for r in rows],
    )
    for side in ("reference", "candidate"):
        out[side] = {
            name: _stats([r[f"{side}_{name}"] for r in rows if r[f"{side}_{name}"] is not None])
            for name in ("latency_ms", "tokens_per_s", "ttft_ms")
        }
    out["errors"] = run.samples.exclude(error="").count()
    return out


# -- the run ----------------------------------------------------------------------------------------------


def side_endpoint(run: EvalRun, side: str) -> Endpoint:
    """Where a side is reached now: its deployment resolved afresh (a new key per launch), or its URL.

    A deployment of a GGUF version also brings that file's chat template (teacher forcing by text).
    """
    deployment_id = getattr(run, f"{side}_deployment_id")
    if deployment_id is None:
        return Endpoint(
            base_url=getattr(run, f"{side}_base_url"),
            model=getattr(run, f"{side}_model"),
            greedy=run.greedy(side),
        )
    endpoint = dataclasses.replace(deployment_endpoint(deployment_id), greedy=run.greedy(side))
    version = ModelVersion.objects.filter(pk=endpoint.info.get("model_version_id") or 0).first()
    if endpoint.chat_template is None and version is not None and version.source_kind == SourceKind.GGUF:
        endpoint = dataclasses.replace(endpoint, chat_template=gguf_chat_template(version.source_path))
    return endpoint


def _push(run: EvalRun, **extra: Any) -> None:
    try:
        push_live_event(
            run_group(run.pk),
            {
                "type": "eval_run.progress",
                "run": run.pk,
                "state": run.state,
                "done": run.done_count,
                "errors": run.error_count,
                "total": run.case_count,
                **extra,
            },
        )
    except Exception:  # a live push must never fail the run (Redis down: the page polls)
        log.warning("eval run %s: live push failed", run.pk, exc_info=True)


def _finish(run: EvalRun, state: str, error: str = "") -> EvalRun:
    run.done_count = run.samples.count()
    run.error_count = run.samples.exclude(error="").count()
    run.summary = run_summary(run)
    run.state = state
    run.error = error
    run.finished_at = timezone.now()
    run.save(
        update_fields=[
            *("done_count", "error_count", "summary", "state", "error", "finished_at"),
            "teacher_forcing_note",
        ]
    )
    _push(run, summary=run.summary)
    return run


def execute_run(run_id: int, *, after_sample: Callable[[EvalSample], None] | None = None) -> EvalRun | None:
    """Run (or resume) an evaluation run to its end; returns the run, or None when another worker holds it.

    `after_sample` is called after each stored sample (tests use it to stop a worker midway).
    """
    lock = get_redis().lock(key("eval", "run", str(run_id)), timeout=LOCK_SECONDS, blocking=False)
    if not lock.acquire():
        log.info("eval run %s is being executed by another worker", run_id)
        return None
    try:
        return _execute(run_id, lock, after_sample)
    finally:
        with contextlib.suppress(Exception):
            lock.release()


# A placeholder result: the queue had nothing within its wait, but the producer is still working.
_NOTHING_YET = CaseResult(job=CaseJob(0, "", 0, [], [], None, None))


def _execute(run_id: int, lock: Any, after_sample: Callable[[EvalSample], None] | None) -> EvalRun | None:
    with transaction.atomic():
        run = EvalRun.objects.select_for_update().filter(pk=run_id).first()
        if run is None or run.finished:
            return run
        run.state = RunState.RUNNING
        run.attempts += 1
        run.started_at = run.started_at or timezone.now()
        run.save(update_fields=["state", "attempts", "started_at"])
    if run.cancel_requested:
        return _finish(run, RunState.CANCELLED)
    try:
        reference, candidate = side_endpoint(run, "reference"), side_endpoint(run, "candidate")
    except EndpointUnavailable as exc:
        return _finish(run, RunState.FAILED, str(exc))
    done = set(run.samples.values_list("case_id", flat=True))
    cases = EvalCase.objects.filter(version_id=run.suite_version_id).order_by("position", "id")
    jobs = [
        CaseJob(
            pk=c.pk,
            case_key=c.case_id,
            position=c.position,
            tags=list(c.tags or []),
            messages=c.chat_messages(),
            expected=c.expected,
            match_rule=c.match_rule or None,
        )
        for c in cases
        if c.pk not in done
    ]
    run.done_count = len(done)
    run.error_count = run.samples.exclude(error="").count()
    _push(run)
    params = RunParams(
        seed=run.seed,
        max_tokens=run.max_tokens,
        top_logprobs=run.top_logprobs,
        concurrency=max(1, run.concurrency),
        timeout=run.request_timeout,
        kl_top_k=settings.EVAL_KL_TOP_K,
    )
    stop = threading.Event()
    shared = _Shared()
    failure: list[BaseException] = []

    def produce() -> None:
        try:
            asyncio.run(_produce(jobs, reference, candidate, params, stop, shared))
        except BaseException as exc:  # reported by the calling thread
            failure.append(exc)
        finally:
            shared.results.put(None)

    # Resolving the sides can take a while (a GGUF's chat template is read once per file): renew first.
    lock.reacquire()
    thread = threading.Thread(target=produce, name=f"eval-run-{run_id}", daemon=True)
    thread.start()
    cancelled = False
    last_push = last_renew = time.monotonic()
    try:
        while True:
            try:
                item: CaseResult | None = shared.results.get(timeout=0.5)
            except queue.Empty:
                if not thread.is_alive():
                    break
                item = _NOTHING_YET
            if item is None:
                break
            now = time.monotonic()
            if now - last_renew > LOCK_SECONDS / 4:
                lock.reacquire()
                last_renew = now
            if item is not _NOTHING_YET:
                if shared.forcing_note and not run.teacher_forcing_note:
                    run.teacher_forcing_note = shared.forcing_note
                    run.save(update_fields=["teacher_forcing_note"])
                sample = sample_from_result(run, item)
                try:
                    with transaction.atomic():
                        sample.save()
                except IntegrityError:
                    log.info("eval run %s: case %s already stored", run_id, item.job.case_key)
                else:
                    run.done_count += 1
                    if sample.error:
                        run.error_count += 1
                    if after_sample is not None:
                        after_sample(sample)
            # Between cases: has someone asked to cancel?
            if EvalRun.objects.filter(pk=run_id, cancel_requested=True).exists():
                cancelled = True
                stop.set()
                break
            if now - last_push >= PROGRESS_INTERVAL:
                EvalRun.objects.filter(pk=run_id).update(
                    done_count=run.done_count, error_count=run.error_count
                )
                _push(run)
                last_push = now
    finally:
        stop.set()
        thread.join(timeout=30)
    if failure:
        return _finish(run, RunState.FAILED, f"{type(failure[0]).__name__}: {failure[0]}")
    if cancelled:
        return _finish(run, RunState.CANCELLED)
    remaining = EvalCase.objects.filter(version_id=run.suite_version_id).exclude(samples__run=run).count()
    if remaining:
        return _finish(run, RunState.FAILED, f"{remaining} case(s) have no sample.")
    return _finish(run, *completed_or_failed(run))


def completed_or_failed(run: EvalRun) -> tuple[str, str]:
    """A run whose every case has a sample is `completed` only when few enough of them failed: a run of
    failed requests measured nothing, and must not look like a result that can be signed off."""
    cases = max(1, run.samples.count())
    failed = run.samples.exclude(error="").count()
    allowed = settings.EVAL_MAX_ERROR_FRACTION
    if failed == cases:
        return RunState.FAILED, (
            f"All {failed} samples failed: no case was scored. See a sample's error, then resume the run "
            "once both engines answer."
        )
    if failed / cases > allowed:
        return RunState.FAILED, (
            f"{failed} of {cases} samples failed ({failed / cases:.0%}), above the {allowed:.0%} a run may "
            "lose (EVAL_MAX_ERROR_FRACTION). See the failed samples' errors, then resume the run: it "
            "runs those cases again."
        )
    return RunState.COMPLETED, ""
