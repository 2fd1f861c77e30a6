"""What a generation request answers: the full JSON body of a chat or text completion, its SSE stream
(and an error once a stream has begun), usage, text, token ids and logprobs."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import orjson
from aiohttp import web

from vllm_sim import logprobs
from vllm_sim.engine import Sequence
from vllm_sim.model import piece as token_text
from vllm_sim.model import token_id
from vllm_sim.protocol import ApiError, SamplingRequest
from vllm_sim.server.state import ServerState


class GenerationOutput(ServerState):
    @staticmethod
    async def _stream_error(request: web.Request, err: ApiError) -> web.StreamResponse:
        """An error raised once a stream has begun (the engine's checks): vLLM has already answered 200,
        so it sends `data: {"error": ...}` and `data: [DONE]` (chat_completion/serving.py:879-886),
        serialized by json.dumps with its default spacing."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        await resp.write(b"data: " + json.dumps(err.body()).encode() + b"\n\ndata: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def _usage(
        self, req: SamplingRequest, seqs: list[Sequence], *, streaming: bool = False
    ) -> dict[str, Any]:
        prompt = sum(len(ids) for ids, _ in req.prompts)
        completion = sum(len(s.out) for s in seqs)
        usage: dict[str, Any] = {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
        }
        # --enable-prompt-tokens-details: the prefix-cache hit as prompt_tokens_details.cached_tokens, when
        # there is one (one per prompt; the n choices of a prompt share it).
        cached = sum(seqs[i * req.n].num_cached_prompt_tokens for i in range(len(req.prompts)))
        if self.args.enable_prompt_tokens_details:
            # vLLM sets usage.prompt_tokens_details = _make_prompt_tokens_details(
            # self.enable_prompt_tokens_details, final_res.num_cached_tokens, ...) whenever the flag is on
            # (vllm/entrypoints/openai/chat_completion/serving.py, the full generator, at 006c49d4): a cold
            # prefix cache reads {"cached_tokens": 0}, not null.
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        elif not streaming:
            # Stream chunks are serialized with exclude_unset=True, which drops the unset details field.
            usage["prompt_tokens_details"] = None
        return usage

    def _text(self, seq: Sequence, start: int, end: int) -> str:
        """Text of output tokens [start, end); a matched stop string and what follows are cut off."""
        decode = self.limits.tokenizer.decode
        out = "".join([token_text(t, decode) for t in seq.out[start:end]])
        if seq.stop_reason is not None and end == len(seq.out):
            cut = out.find(seq.stop_reason)
            if cut >= 0:
                out = out[:cut]
        return out

    def _chat_logprobs(
        self, seq: Sequence, start: int, end: int, req: SamplingRequest, as_ids: bool = False
    ) -> dict[str, Any]:
        return logprobs.chat_logprobs(
            seq, start, end, req.logprobs or 0, as_ids, req.logprob_token_ids, self.limits.tokenizer,
            self.limits.vocab_size,
        )  # fmt: skip

    def _completion_logprobs(
        self, seq: Sequence, start: int, end: int, req: SamplingRequest, offset: int, as_ids: bool = False
    ) -> dict[str, Any]:
        return logprobs.completion_logprobs(
            seq, start, end, req.logprobs or 0, offset, as_ids, req.logprob_token_ids, self.limits.tokenizer
        )

    def _prompt_logprobs(self, req: SamplingRequest, ids: list[int]) -> list[Any] | None:
        if req.prompt_logprobs is None:
            return None
        return logprobs.prompt_logprobs(
            ids,
            req.prompt_logprobs,
            self.args.sim_quality_drift,
            self.limits.tokenizer,
            self.limits.vocab_size,
        )

    @staticmethod
    def _echoed(req: SamplingRequest, prompt_text: str) -> str:
        """The prompt in front of a completion's text with `echo`; not with `return_token_ids`, whose
        prompt comes back as prompt_token_ids (completion/serving.py, request_output_to_completion_response:
        `if request.return_token_ids: prompt_text = ""`, at 030ea52e)."""
        return prompt_text if req.echo and not req.return_token_ids else ""

    def _echo_logprobs(self, req: SamplingRequest, ids: list[int]) -> tuple[dict[str, list[Any]], int]:
        """An echoed prompt's part of a completion's logprobs, and the text offset after it. vLLM computes
        prompt_logprobs with k = logprobs for an echo (protocol to_sampling_params) and puts them in front
        of the output's (`out_logprobs = [*prompt_logprobs, *output.logprobs]`); the first prompt token
        has none (None, None), and each position lists the token then the top k, as for the output."""
        k = req.logprobs or 0
        entries = logprobs.prompt_logprobs(
            ids, k, self.args.sim_quality_drift, self.limits.tokenizer, self.limits.vocab_size
        )
        out: dict[str, list[Any]] = {
            "text_offset": [],
            "token_logprobs": [],
            "tokens": [],
            "top_logprobs": [],
        }
        offset = 0
        for tid, entry in zip(ids, entries, strict=True):
            piece = self.limits.tokenizer.decode([tid])
            out["tokens"].append(piece)
            out["text_offset"].append(offset)
            offset += len(piece)
            if entry is None:
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
                continue
            out["token_logprobs"].append(max(entry[str(tid)]["logprob"], -9999.0))
            listed = list(entry.values())[: k + 1] if k != -1 else []
            out["top_logprobs"].append({e["decoded_token"]: max(e["logprob"], -9999.0) for e in listed})
        return out, offset

    def _echo_and_output_logprobs(
        self, seq: Sequence, req: SamplingRequest, prompt_ids: list[int], as_ids: bool
    ) -> dict[str, Any]:
        if not req.echo or req.logprob_token_ids:
            return self._completion_logprobs(seq, 0, len(seq.out), req, 0, as_ids)
        head, offset = self._echo_logprobs(req, prompt_ids)
        tail = self._completion_logprobs(seq, 0, len(seq.out), req, offset, as_ids)
        return {name: head[name] + tail[name] for name in tail}

    @staticmethod
    def _token_ids(seq: Sequence) -> list[int]:
        return [token_id(t) for t in seq.out]

    def _full_response(
        self, req: SamplingRequest, seqs: list[Sequence], rid: str, chat: bool
    ) -> dict[str, Any]:
        created = int(time.time())
        choices = []
        as_ids = req.return_tokens_as_token_ids
        for i, s in enumerate(seqs):
            content = self._text(s, 0, len(s.out))
            if chat:
                content = req.chat_echo + content
                choices.append(
                    {
                        "index": i,
                        "message": {
                            "role": req.role,
                            "content": content,
                            "refusal": None,
                            "annotations": None,
                            "audio": None,
                            "function_call": None,
                            "tool_calls": [],
                            "reasoning": None,
                        },
                        "logprobs": self._chat_logprobs(s, 0, len(s.out), req, as_ids)
                        if req.wants_logprobs
                        else None,
                        "finish_reason": s.finish_reason,
                        "stop_reason": s.stop_reason,
                        "token_ids": self._token_ids(s) if req.return_token_ids else None,
                    }
                )
            else:
                prompt_ids, prompt_text = req.prompts[i // req.n]
                choices.append(
                    {
                        "index": i,
                        "text": self._echoed(req, prompt_text) + content,
                        "logprobs": self._echo_and_output_logprobs(s, req, prompt_ids, as_ids)
                        if req.wants_logprobs
                        else None,
                        "finish_reason": s.finish_reason,
                        "stop_reason": s.stop_reason,
                        "token_ids": self._token_ids(s) if req.return_token_ids else None,
                        "prompt_logprobs": self._prompt_logprobs(req, s.prompt_ids),
                        "prompt_token_ids": list(s.prompt_ids) if req.return_token_ids else None,
                    }
                )
        body: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": req.model,
            "choices": choices,
        }
        # Field order of vLLM's ChatCompletionResponse / CompletionResponse (non-streaming responses are
        # dumped with every field, unset ones as null).
        body["service_tier"] = None
        body["system_fingerprint"] = None
        body["usage"] = self._usage(req, seqs)
        if chat:
            body["prompt_logprobs"] = self._prompt_logprobs(req, seqs[0].prompt_ids)
            body["prompt_token_ids"] = list(seqs[0].prompt_ids) if req.return_token_ids else None
        body["kv_transfer_params"] = None
        return body

    async def _stream(
        self,
        request: web.Request,
        req: SamplingRequest,
        seqs: list[Sequence],
        event: asyncio.Event,
        rid: str,
        chat: bool,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        model = req.model
        dumps = orjson.dumps
        sent = [0] * len(seqs)
        done = [False] * len(seqs)
        offsets = [0] * len(seqs)
        hold = [max((len(x) for x in s.stop), default=1) - 1 for s in seqs]
        chars_sent = [0] * len(seqs)
        first_ids_sent = [False] * len(seqs)
        parts: list[bytes] = []
        if chat:
            for i in range(len(seqs)):
                first_choice = {
                    "index": i,
                    "delta": {"role": req.role, "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
                first: dict[str, Any] = {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": model,
                    "choices": [first_choice],
                }
                if req.include_usage and req.continuous_usage:
                    first["usage"] = self._usage(req, seqs, streaming=True)
                if req.return_token_ids:
                    # vLLM: the prompt's token ids on the first chunk, each chunk's own in its choice.
                    first["prompt_token_ids"] = list(seqs[i].prompt_ids)
                    first["choices"] = [{**first_choice, "token_ids": []}]
                parts.append(b"data: " + dumps(first) + b"\n\n")
                if req.chat_echo:
                    echo_chunk = {
                        "id": rid,
                        "object": obj,
                        "created": created,
                        "model": model,
                        "choices": [
                            {
                                "index": i,
                                "delta": {"content": req.chat_echo},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ],
                    }
                    parts.append(b"data: " + dumps(echo_chunk) + b"\n\n")
        elif req.echo:
            for i in range(len(seqs)):
                pids, ptxt = req.prompts[i // req.n]
                echo_lp, offsets[i] = (
                    self._echo_logprobs(req, pids)
                    if req.wants_logprobs and not req.logprob_token_ids
                    else (None, len(ptxt))
                )
                echo = {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": i,
                            "text": self._echoed(req, ptxt),
                            "logprobs": echo_lp,
                            "finish_reason": None,
                            "stop_reason": None,
                        }
                    ],
                }
                parts.append(b"data: " + dumps(echo) + b"\n\n")
        # vLLM sends the role (and echo) chunk from inside its loop over engine outputs, i.e. with the
        # first token: until the engine produces one, a stream is headers only (a hung engine sends
        # nothing more, which is what a proxy's first-byte timeout is for).
        engine_spoke = False
        while True:
            event.clear()
            for i, s in enumerate(seqs):
                if done[i]:
                    continue
                end = len(s.out)
                finished = s.finished
                if end == sent[i] and not finished:
                    continue
                engine_spoke = True
                if hold[i]:
                    # Like vLLM's detokenizer, keep back as many characters as a stop string could
                    # still need, so a stop string spanning several tokens is never half-sent.
                    full = self._text(s, 0, end)
                    limit = len(full) if finished else max(chars_sent[i], len(full) - hold[i])
                    piece = full[chars_sent[i] : limit]
                    chars_sent[i] = limit
                else:
                    piece = self._text(s, sent[i], end)
                new_ids = [token_id(t) for t in s.out[sent[i] : end]] if req.return_token_ids else None
                lp: dict[str, Any] | None = None
                if req.wants_logprobs:
                    as_ids = req.return_tokens_as_token_ids
                    if chat:
                        lp = self._chat_logprobs(s, sent[i], end, req, as_ids)
                    else:
                        lp = self._completion_logprobs(s, sent[i], end, req, offsets[i], as_ids)
                offsets[i] += len(piece)
                sent[i] = end
                if finished:
                    done[i] = True
                if chat:
                    choice: dict[str, Any] = {
                        "index": i,
                        "delta": {"content": piece},
                        "logprobs": lp,
                        "finish_reason": s.finish_reason if finished else None,
                    }
                    if finished:
                        choice["stop_reason"] = s.stop_reason
                else:
                    choice = {
                        "index": i,
                        "text": piece,
                        "logprobs": lp,
                        "finish_reason": s.finish_reason if finished else None,
                        "stop_reason": s.stop_reason if finished else None,
                    }
                    if new_ids is not None and not first_ids_sent[i]:
                        choice["prompt_token_ids"] = list(s.prompt_ids)
                        first_ids_sent[i] = True
                if new_ids is not None:
                    choice["token_ids"] = new_ids
                chunk: dict[str, Any] = {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": model,
                    "choices": [choice],
                }
                if req.include_usage and req.continuous_usage:
                    chunk["usage"] = self._usage(req, seqs, streaming=True)
                parts.append(b"data: " + dumps(chunk) + b"\n\n")
            if all(done):
                if req.include_usage:
                    final = {
                        "id": rid,
                        "object": obj,
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": self._usage(req, seqs, streaming=True),
                    }
                    parts.append(b"data: " + dumps(final) + b"\n\n")
                parts.append(b"data: [DONE]\n\n")
                await resp.write(b"".join(parts))
                break
            if parts and engine_spoke:
                await resp.write(b"".join(parts))
                parts = []
            await event.wait()
        await resp.write_eof()
        return resp
