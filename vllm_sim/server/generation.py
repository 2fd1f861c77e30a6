"""The generation endpoints: POST /v1/chat/completions, /v1/chat/completions/batch, /v1/completions,
/v1/responses and SageMaker's /invocations; and what runs a request on an engine core (the --sim-*
fault knobs, the data-parallel balancer, the sequences of its prompts and choices)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web

from vllm_sim import model, text
from vllm_sim.engine import Sequence, SimEngine
from vllm_sim.protocol import (
    ApiError,
    SamplingRequest,
    body_error,
    engine_checks,
    parse_batch_chat,
    parse_chat,
    parse_completion,
)
from vllm_sim.server.output import GenerationOutput
from vllm_sim.server.state import _json

logger = logging.getLogger("vllm_sim")


# EngineDeadError's message (vllm/v1/engine/exceptions.py).
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."


class GenerationRoutes(GenerationOutput):
    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        req = parse_chat(await self._body(request), self.limits)
        return await self._generate(request, req, chat=True)

    async def batch_chat_completions(self, request: web.Request) -> web.Response:
        """POST /v1/chat/completions/batch (chat_completion/api_router.py:77-102): `messages` is a list of
        conversations, each run as its own request; one choice per conversation, indexed in order, usage
        summed (chat_completion/batch_serving.py:104-332). Not streamed; n must be 1."""
        body = await self._body(request)
        if not isinstance(body, dict):
            raise body_error(
                "model_attributes_type", "", "Input should be a valid dictionary or object", body
            )
        convs = parse_batch_chat(body)
        # to_chat_completion_request (protocol.py:1158-1164): the shared fields plus one conversation;
        # `stream` is not a field of the batch request, so each sub-request is non-streaming.
        shared = {k: v for k, v in body.items() if k not in ("messages", "stream", "stream_options")}
        reqs = [parse_chat({**shared, "messages": conv}, self.limits) for conv in convs]
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(self._collect(req, request)) for req in reqs]
        except* ApiError as errors:
            # The first refusal answers the batch (the other conversations are cancelled).
            raise errors.exceptions[0] from None
        results = [t.result() for t in tasks]
        rid = "chatcmpl-" + uuid.uuid4().hex
        choices = []
        prompt_tokens = completion_tokens = 0
        for i, (req, seqs, conv) in enumerate(zip(reqs, results, convs, strict=True)):
            if body.get("echo"):
                # The batch path echoes the last message whatever its role (batch_serving.py:288-297).
                last = conv[-1].get("content") if isinstance(conv[-1], dict) else None
                req.chat_echo = text.content_text(last) if isinstance(last, list) else (last or "")
            choice = self._full_response(req, seqs, rid, chat=True)["choices"][0]
            choice["index"] = i
            choices.append(choice)
            prompt_tokens += len(seqs[0].prompt_ids)
            completion_tokens += len(seqs[0].out)
        return _json(
            {
                "id": rid,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": reqs[0].model,
                "choices": choices,
                "service_tier": None,
                "system_fingerprint": None,
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                    "completion_tokens": completion_tokens,
                    "prompt_tokens_details": None,
                },
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "kv_transfer_params": None,
            }
        )

    async def completions(self, request: web.Request) -> web.StreamResponse:
        req = parse_completion(await self._body(request), self.limits)
        return await self._generate(request, req, chat=False)

    async def responses(self, request: web.Request) -> web.Response:
        """A minimal OpenAI Responses API (responses/api_router.py:48): text input or messages,
        `instructions`, `max_output_tokens`; answered in the Response object's shape, not streamed."""
        body = await self._body(request)
        if not isinstance(body, dict):
            raise body_error(
                "model_attributes_type", "", "Input should be a valid dictionary or object", body
            )
        if "input" not in body:
            raise body_error("missing", "input", "Field required", body)
        if body.get("stream"):
            raise ApiError(
                501, "NotImplementedError", "The simulator's /v1/responses does not stream (stream=false)."
            )
        messages: list[dict[str, Any]] = []
        if body.get("instructions"):
            messages.append({"role": "system", "content": body["instructions"]})
        raw = body["input"]
        if isinstance(raw, str):
            messages.append({"role": "user", "content": raw})
        elif isinstance(raw, list):
            for item in raw:
                content = item.get("content") if isinstance(item, dict) else None
                if isinstance(content, list):
                    content = "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
                if not isinstance(item, dict) or not isinstance(content, str):
                    raise body_error("string_type", "input", "Input should be a valid string", item)
                messages.append({"role": item.get("role", "user"), "content": content})
        else:
            raise body_error("string_type", "input", "Input should be a valid string", raw)
        chat_body: dict[str, Any] = {"messages": messages}
        for key in ("model", "temperature", "top_p", "seed"):
            if body.get(key) is not None:
                chat_body[key] = body[key]
        if body.get("max_output_tokens") is not None:
            chat_body["max_completion_tokens"] = body["max_output_tokens"]
        req = parse_chat(chat_body, self.limits)
        seqs = await self._collect(req)
        s = seqs[0]
        usage = self._usage(req, seqs)
        complete = s.finish_reason != "length"
        return _json(
            {
                "id": "resp_" + uuid.uuid4().hex,
                "created_at": int(time.time()),
                "incomplete_details": None if complete else {"reason": "max_output_tokens"},
                "instructions": body.get("instructions"),
                "metadata": body.get("metadata"),
                "model": req.model,
                "object": "response",
                "output": [
                    {
                        "id": "msg_" + uuid.uuid4().hex,
                        "content": [
                            {
                                "annotations": [],
                                "text": self._text(s, 0, len(s.out)),
                                "type": "output_text",
                                "logprobs": None,
                            }
                        ],
                        "role": "assistant",
                        "status": "completed" if complete else "incomplete",
                        "type": "message",
                    }
                ],
                "parallel_tool_calls": True,
                "temperature": req.temperature,
                "tool_choice": "auto",
                "tools": [],
                "top_p": body.get("top_p", 1.0),
                "background": False,
                "max_output_tokens": req.max_tokens,
                "previous_response_id": None,
                "reasoning": None,
                "service_tier": "auto",
                "status": "completed" if complete else "incomplete",
                "text": None,
                "truncation": "disabled",
                "usage": {
                    "input_tokens": usage["prompt_tokens"],
                    "input_tokens_details": {"cached_tokens": s.num_cached_prompt_tokens},
                    "output_tokens": usage["completion_tokens"],
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": usage["total_tokens"],
                },
                "user": None,
            }
        )

    async def _collect(self, req: SamplingRequest, request: web.Request | None = None) -> list[Sequence]:
        """Run a validated request to completion (non-streaming paths)."""
        self._faults()
        engine_checks(req, self.limits)
        event = asyncio.Event()
        seqs = self._sequences(req, event.set)
        engine = self._pick_engine(request)
        self.in_flight += 1
        for s in seqs:
            engine.add(s)
        try:
            while not all(s.finished for s in seqs):
                event.clear()
                await event.wait()
            if engine.dead:
                raise ApiError(500, "InternalServerError", ENGINE_DEAD_MESSAGE)
            return seqs
        finally:
            self.in_flight -= 1
            for s in seqs:
                if not s.finished:
                    engine.abort(s)

    def _faults(self) -> None:
        """Apply the fault knobs to a generation request that passed validation."""
        a = self.args
        self.request_count += 1
        if a.sim_crash_after is not None and self.request_count > a.sim_crash_after:
            logger.error("Simulated engine crash (--sim-crash-after %d): exiting.", a.sim_crash_after)
            sys.stderr.flush()
            os._exit(1)
        if a.sim_hang_after is not None and self.request_count > a.sim_hang_after and not self.engine.hung:
            logger.error(
                "Simulated engine hang (--sim-hang-after %d): engine stops stepping.", a.sim_hang_after
            )
            for e in self.engines:
                e.hung = True
        if a.sim_engine_dead_after is not None and self.request_count > a.sim_engine_dead_after:
            if not self.engine.dead:
                logger.error(
                    "Simulated engine death (--sim-engine-dead-after %d): EngineDeadError.",
                    a.sim_engine_dead_after,
                )
                for e in self.engines:
                    e.kill()
            raise ApiError(500, "InternalServerError", ENGINE_DEAD_MESSAGE)
        if a.sim_error_rate > 0 and self.error_rng.random() < a.sim_error_rate:
            raise ApiError(500, "InternalServerError", "Simulated engine error (--sim-error-rate).")

    def _pick_engine(self, request: web.Request | None) -> SimEngine:
        """The data-parallel engine core for a request: the `X-data-parallel-rank` header when it names
        one (generate/base/serving.py:206-218), else the least loaded, lowest rank first on a tie
        (DPLBAsyncMPClient.get_core_engine_for_request, v1/engine/core_client.py:1472-1510: waiting +
        running, waiting penalised by KV-cache pressure above 50 %)."""
        engines = self.engines
        if len(engines) == 1:
            return engines[0]
        if request is not None:
            raw = request.headers.get("X-data-parallel-rank")
            with contextlib.suppress(TypeError, ValueError):
                rank = int(raw)  # type: ignore[arg-type]
                if 0 <= rank < len(engines):
                    return engines[rank]

        def score(e: SimEngine) -> float:
            waiting = len(e.waiting)
            return waiting + len(e.running) + waiting * 6.0 * max(0.0, e.kv_cache_usage - 0.5)

        return min(engines, key=score)

    def _sequences(self, req: SamplingRequest, notify: Callable[[], None]) -> list[Sequence]:
        seqs = []
        mean = self.args.sim_mean_output_tokens
        # Ids outside the simulated model's output pieces are held as model.FOREIGN + id: allowed ids
        # force them (vLLM masks every other token), a large bias can pick them.
        bias = None
        if req.logit_bias:
            bias = {model.generated_index(t): b for t, b in req.logit_bias.items()}
        allowed = None
        if req.allowed_token_ids:
            allowed = frozenset(model.generated_index(t) for t in req.allowed_token_ids)
        for ids, _ in req.prompts:
            for j in range(req.n):
                seed_part: object
                if req.temperature == 0.0:
                    seed_part = "greedy"  # greedy decoding: the prompt alone decides
                elif req.seed is not None and req.seed != -1:  # vLLM treats seed -1 as no seed
                    seed_part = (req.seed, j)
                else:
                    # An unseeded sampler differs from request to request, as vLLM's does.
                    seed_part = (self.args.seed, self.request_count, j, "unseeded")
                key = text.request_key(ids, seed_part)
                max_tokens = req.max_tokens or (self.shape.max_model_len - len(ids))
                seqs.append(
                    Sequence(
                        prompt_ids=ids,
                        max_tokens=max_tokens,
                        key=key,
                        mean_len=mean,
                        drift=self.args.sim_quality_drift,
                        greedy=req.temperature == 0.0 or req.beam,
                        keep_contexts=req.wants_logprobs or req.beam,
                        ignore_eos=req.ignore_eos,
                        min_tokens=req.min_tokens,
                        stop=req.stop,
                        notify=notify,
                        stream=req.stream,
                        bias=bias,
                        allowed=allowed,
                        first_rank=j if req.beam else 0,
                    )
                )
        return seqs

    @staticmethod
    def _best_beams(req: SamplingRequest, seqs: list[Sequence]) -> list[Sequence]:
        """Beam search's answer: the beams best first, by cumulative logprob / length**length_penalty,
        the length counting the prompt and leaving out a final end-of-sequence (beam_search/utils.py
        sort_beams_key; online.py sorts the completed beams and keeps beam_width = n of them)."""

        def score(s: Sequence) -> float:
            total = sum(
                model.distribution(h, s.drift).logprob(tok)
                for h, tok in zip(s.out_contexts, s.out, strict=True)
            )
            length = (
                len(s.prompt_ids) + len(s.out) - (1 if s.finish_reason == "stop" and not s.stop_reason else 0)
            )
            return total / max(1, length) ** req.length_penalty

        return sorted(seqs, key=score, reverse=True)

    async def _generate(
        self, request: web.Request, req: SamplingRequest, *, chat: bool
    ) -> web.StreamResponse:
        self._faults()
        try:
            engine_checks(req, self.limits)
        except ApiError as err:
            if not req.stream:
                raise
            return await self._stream_error(request, err)
        event = asyncio.Event()
        seqs = self._sequences(req, event.set)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        engine = self._pick_engine(request)
        self.in_flight += 1
        engine.metrics.request_params_n.observe(req.n)
        engine.metrics.request_params_max_tokens.observe(seqs[0].max_tokens)
        engine.metrics.request_max_num_generation_tokens.observe(seqs[0].max_tokens)
        for s in seqs:
            engine.add(s)
        try:
            if req.stream:
                return await self._stream(request, req, seqs, event, rid, chat)
            while True:
                event.clear()
                if all(s.finished for s in seqs):
                    break
                await event.wait()
            if engine.dead:
                raise ApiError(500, "InternalServerError", ENGINE_DEAD_MESSAGE)
            answer = self._best_beams(req, seqs) if req.beam else seqs
            return _json(self._full_response(req, answer, rid, chat))
        finally:
            self.in_flight -= 1
            for s in seqs:
                if not s.finished:
                    engine.abort(s)

    async def invocations(self, request: web.Request) -> web.StreamResponse:
        """SageMaker's dispatcher: the first request schema the body fits (chat, then completion)."""
        body = await self._body(request)
        if isinstance(body, dict) and "messages" in body:
            return await self._generate(request, parse_chat(body, self.limits), chat=True)
        if isinstance(body, dict) and "prompt" in body:
            return await self._generate(request, parse_completion(body, self.limits), chat=False)
        raise ApiError(
            400,
            "BadRequestError",
            "Cannot find suitable handler for request. Expected one of: "
            "['ChatCompletionRequest', 'CompletionRequest']",
        )
