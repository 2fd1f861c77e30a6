"""One OpenAI API whatever the engine: what the proxy does so that every engine kind answers as vLLM does.

vLLM and the simulator (which speaks vLLM's API) get the client's body as it is and their answers pass
untouched: `for_endpoint` gives them no dialect, and the relay's fast path stays as it was.

llama-cpp-python's server (engine "llamacpp") differs from vLLM in ways a tenant would notice, and the
proxy handles each one: it translates the parameter, emulates it, or refuses it with an OpenAI-shaped 400
that names it. Never silently dropped. docs/proxy.md#one-api-whatever-the-engine has the table, and
tests/routing/test_conformance.py runs the same cases against both kinds. What differs, as read from
llama-cpp-python 0.3.36 (llama_cpp/server/types.py, llama_cpp/llama_chat_format.py):

- its request model has no `max_completion_tokens`, `stream_options`, `repetition_penalty`, or
  `json_schema` response format; pydantic ignores unknown fields, so they were dropped without a word;
- its sampling defaults are not vLLM's: temperature 0.8, top_p 0.95, top_k 40, min_p 0.05 and a repeat
  penalty of 1.1. vLLM's are 1.0, 1.0, off, 0 and 1.0, so `temperature: 0` was not even greedy there;
- it ignores `n` and sends no usage in a stream;
- a chat's `top_logprobs` is a dict of the top k plus the sampled token (k + 1 entries when that token is
  not among them), and `bytes` is null;
- a body its pydantic model refuses comes back as HTTP 500 ("N validation error: ..."), not 400.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from routing.proxy.errors import ProxyError, bad_request

# What vLLM answers to `tools` with tool_choice "auto" on a server without a tool-call parser, as the
# simulator answers it too.
from vllm_sim.protocol import AUTO_TOOLS

LLAMACPP = "llamacpp"

# vLLM's sampling defaults (SamplingParams, and the OpenAI API's), where llama-cpp-python's differ.
# vLLM's `top_k` is off at 0 or -1; llama.cpp's top-k sampler is off at k <= 0 (llama_sampler_top_k_impl).
VLLM_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0}
# vLLM's --max-logprobs default (vllm/config/model.py: max_logprobs = 20).
MAX_LOGPROBS = 20
# Fields of vLLM's answers that llama-cpp-python leaves out, with the value vLLM gives them.
CHAT_ANSWER = {"service_tier": None, "system_fingerprint": None, "prompt_logprobs": None,
               "prompt_token_ids": None, "kv_transfer_params": None}  # fmt: skip
COMPLETION_ANSWER = {"service_tier": None, "system_fingerprint": None, "kv_transfer_params": None}
CHAT_MESSAGE: dict[str, Any] = {"refusal": None, "annotations": None, "audio": None, "function_call": None,
                "tool_calls": [], "reasoning": None}  # fmt: skip
CHAT_CHOICE = {"stop_reason": None, "token_ids": None}
COMPLETION_CHOICE = {
    "stop_reason": None,
    "token_ids": None,
    "prompt_logprobs": None,
    "prompt_token_ids": None,
}


def for_endpoint(engine: str, body: dict[str, Any], kind: str, prompt_tokens: int) -> LlamaCpp | None:
    """The dialect of an endpoint's engine for this request; None where the body goes as it is."""
    if engine != LLAMACPP or kind == "embedding":
        return None
    return LlamaCpp(body, kind, prompt_tokens)


@dataclass
class LlamaCpp:
    """One request to a llama.cpp engine: the bodies it is sent, and its answer made vLLM's."""

    body: dict[str, Any]
    kind: str
    prompt_tokens: int  # the proxy's count (the GGUF's own vocabulary): the usage of a stream
    chat: bool = field(init=False)
    n: int = field(init=False)
    top_logprobs: int | None = field(init=False)
    named_tool: bool = field(init=False)
    # A stream: completion tokens seen (one per text chunk, as llama.cpp sends one per token), and
    # whether the engine sent usage itself.
    streamed_tokens: int = 0
    usage_seen: bool = False
    # A fanned-out stream: the choice whose stream is being read (the streams come one after another,
    # each with its own end).
    streams_ended: int = 0
    # The stream's id, model and time, for the usage chunk the proxy adds.
    stream_head: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.chat = self.kind == "chat"
        self.n = self.body.get("n") or 1
        self.top_logprobs = self.body.get("top_logprobs") if self.chat and self.body.get("logprobs") else None
        choice = self.body.get("tool_choice")
        self.named_tool = self.chat and isinstance(choice, dict) and bool(self.body.get("tools"))
        self.check()

    def check(self) -> None:
        """vLLM's refusals that llama-cpp-python lacks (or answers with a 500), and what it cannot do."""
        body, stream = self.body, bool(self.body.get("stream"))
        if body.get("stream_options") and not stream:
            raise bad_request(
                "Stream options can only be defined when `stream=True`.", param="stream_options"
            )
        temperature = body.get("temperature")
        if self.n > 1 and isinstance(temperature, int | float) and temperature < 1e-5:
            raise bad_request(f"n must be 1 when using greedy sampling, got {self.n}.", param="n")
        best_of = body.get("best_of")
        if body.get("use_beam_search") or (isinstance(best_of, int | float) and best_of > 1):
            raise bad_request(
                "Beam search ('use_beam_search', 'best_of') is not available on this model's llama.cpp "
                "engine.",
                param="use_beam_search" if body.get("use_beam_search") else "best_of",
                code="unsupported_parameter",
            )
        self._check_logprobs()
        if self.chat:
            self._check_tools()
        else:
            prompt = body.get("prompt")
            if prompt in ("", []):
                # vLLM's wording (CompletionRequest's validator); llama.cpp fails on it with a 500.
                raise bad_request(
                    "Either prompt or prompt_embeds must be provided and non-empty.", param="prompt"
                )
            if isinstance(prompt, list) and not all(isinstance(p, int) for p in prompt) and len(prompt) > 1:
                raise bad_request(
                    "A list of prompts is not available on this model's llama.cpp engine: send one prompt "
                    "per request.",
                    param="prompt",
                    code="unsupported_parameter",
                )
        fmt = body.get("response_format")
        if fmt is not None and (
            not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema")
        ):
            raise bad_request(
                "'response_format.type' must be one of 'text', 'json_object' or 'json_schema'.",
                param="response_format",
            )

    def _check_logprobs(self) -> None:
        body = self.body
        name = "top_logprobs" if self.chat else "logprobs"
        value = body.get(name)
        if value is None:
            return
        if not isinstance(value, int) or isinstance(value, bool):
            raise bad_request(f"`{name}` must be an integer.", param=name)
        if value < 0:
            raise bad_request(f"`{name}` must be a positive value or -1.", param=name)
        if self.chat and not body.get("logprobs"):
            raise bad_request("when using `top_logprobs`, `logprobs` must be set to true.", param=name)
        if value > MAX_LOGPROBS:
            raise bad_request(
                f"Requested sample logprobs of {value}, which is greater than max allowed: {MAX_LOGPROBS}",
                param=name,
            )

    def _check_tools(self) -> None:
        body = self.body
        tools = body.get("tools")
        choice = body.get("tool_choice")
        if not tools:
            if choice not in (None, "none"):
                raise bad_request("When using `tool_choice`, `tools` must be set.", param="tool_choice")
            return
        if choice is None or choice == "auto":
            # Same answer as vLLM without a tool-call parser: llama-cpp-python renders the tools into the
            # prompt but has no parser for a GGUF's own chat template, so "auto" would answer text.
            raise bad_request(AUTO_TOOLS, param="tool_choice")
        if choice == "required":
            raise bad_request(
                "tool_choice 'required' is not available on this model's llama.cpp engine: name the "
                "function to call ({'type': 'function', 'function': {'name': ...}}) or send 'none'.",
                param="tool_choice",
                code="unsupported_parameter",
            )
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name")
            names = [(t.get("function") or {}).get("name") for t in tools if isinstance(t, dict)]
            if name not in names:
                raise bad_request(f"Tool '{name}' has not been passed in `tools`.", param="tool_choice")

    # The request -----------------------------------------------------------------------------------

    def bodies(self, model: str) -> list[bytes]:
        """What the engine is sent: one body, or one per choice when `n` > 1 (a stream's are called one
        after another, see call.ChainedResponse; a whole answer's all at once)."""
        one = self.translated(model)
        if self.n == 1:
            return [orjson.dumps(one)]
        seed = self.body.get("seed")
        out = []
        for i in range(self.n):
            # vLLM samples the n choices apart, reproducibly for a given seed: seed + i does the same.
            copy = {**one, "seed": (seed + i) if isinstance(seed, int) else random.randrange(2**31)}
            out.append(orjson.dumps(copy))
        return out

    def translated(self, model: str) -> dict[str, Any]:
        body = self.body
        out = {k: v for k, v in body.items() if k not in ("stream_options", "max_completion_tokens", "n",
                                                          "repetition_penalty", "top_k")}  # fmt: skip
        out["model"] = model
        if self.chat and body.get("max_completion_tokens") is not None:
            out["max_tokens"] = body["max_completion_tokens"]  # vLLM: it wins over max_tokens
        for name, value in VLLM_SAMPLING.items():
            out.setdefault(name, value)
        if body.get("repetition_penalty") is not None:
            out["repeat_penalty"] = body["repetition_penalty"]
        top_k = body.get("top_k")
        if isinstance(top_k, int) and top_k > 0:
            out["top_k"] = top_k
        fmt = body.get("response_format")
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            # llama-cpp-python constrains json_object to a schema given beside it (a grammar from it).
            schema = (fmt.get("json_schema") or {}).get("schema")
            out["response_format"] = {"type": "json_object", **({"schema": schema} if schema else {})}
        return out

    # The answer ------------------------------------------------------------------------------------

    def whole(self, answers: list[bytes]) -> bytes:
        """The engine's answer (one per choice when fanned out) as vLLM's body."""
        try:
            parsed = [orjson.loads(a) for a in answers]
        except orjson.JSONDecodeError:
            return answers[0]
        body = parsed[0]
        if not isinstance(body, dict):
            return answers[0]
        if len(parsed) > 1:
            choices, completion = [], 0
            for i, one in enumerate(parsed):
                for choice in one.get("choices") or []:
                    choices.append({**choice, "index": i})
                completion += (one.get("usage") or {}).get("completion_tokens") or 0
            body["choices"] = choices
            usage = body.get("usage") or {}
            prompt = usage.get("prompt_tokens") or self.prompt_tokens
            body["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion,
                             "total_tokens": prompt + completion}  # fmt: skip
        for name, value in (CHAT_ANSWER if self.chat else COMPLETION_ANSWER).items():
            body.setdefault(name, value)
        usage = body.get("usage")
        if isinstance(usage, dict):
            usage.setdefault("prompt_tokens_details", None)
        for choice in body.get("choices") or []:
            self._choice(choice, "message")
        return orjson.dumps(body)

    def _choice(self, choice: dict[str, Any], box: str) -> None:
        for name, value in (CHAT_CHOICE if self.chat else COMPLETION_CHOICE).items():
            choice.setdefault(name, value)
        if self.chat:
            message = choice.get(box)
            if isinstance(message, dict) and box == "message":
                for name, value in CHAT_MESSAGE.items():
                    message.setdefault(name, value)
                if self.named_tool and message.get("tool_calls"):
                    # vLLM answers a named tool choice with content "" and finish_reason "stop"
                    # (chat_completion/serving.py, ChatCompletionNamedToolChoiceParam).
                    message["content"] = ""
                    message["function_call"] = None
                    if choice.get("finish_reason") == "tool_calls":
                        choice["finish_reason"] = "stop"
            logprobs = choice.get("logprobs")
            if isinstance(logprobs, dict):
                choice["logprobs"] = {"content": [self._token(t) for t in logprobs.get("content") or []]}

    def _token(self, entry: dict[str, Any]) -> dict[str, Any]:
        """A chat logprob entry as vLLM's: `bytes` filled, and exactly the top k, highest first."""
        top = sorted(entry.get("top_logprobs") or [], key=lambda t: -t.get("logprob", float("-inf")))
        k = self.top_logprobs or 0
        return {
            "token": entry.get("token"),
            "logprob": entry.get("logprob"),
            "bytes": list(str(entry.get("token") or "").encode()),
            "top_logprobs": [
                {
                    "token": t.get("token"),
                    "logprob": t.get("logprob"),
                    "bytes": list(str(t.get("token")).encode()),
                }
                for t in top[:k]
            ],
        }

    def events(self, events: bytes) -> bytes:
        """A batch of whole SSE events of a stream, each chunk as vLLM's; a usage chunk built from the
        tokens counted goes before `[DONE]` when the engine sent none (the relay then keeps it only
        for a client that asked, as it does with an engine's)."""
        out: list[bytes] = []
        for event in _split(events):
            if event == b"data: [DONE]":
                self.streams_ended += 1
                if self.streams_ended < self.n:
                    continue  # the next choice's stream follows
                if not self.usage_seen:
                    out.append(b"data: " + orjson.dumps(self._usage_chunk()) + b"\n\n")
                out.append(event + b"\n\n")
                continue
            if not event.startswith(b"data: {"):
                out.append(event + b"\n\n")
                continue
            try:
                obj = orjson.loads(event[6:])
            except orjson.JSONDecodeError:
                out.append(event + b"\n\n")
                continue
            if isinstance(obj, dict):
                self._chunk(obj)
                event = b"data: " + orjson.dumps(obj)
            out.append(event + b"\n\n")
        return b"".join(out)

    def _chunk(self, obj: dict[str, Any]) -> None:
        if isinstance(obj.get("usage"), dict):
            self.usage_seen = True
        if not self.stream_head:
            self.stream_head = {k: obj.get(k) for k in ("id", "created", "model")}
        for choice in obj.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            if self.n > 1:
                choice["index"] = self.streams_ended
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if choice.get("finish_reason") is None and isinstance(text, str) and text:
                self.streamed_tokens += 1
            if self.chat and isinstance(delta, dict) and delta.get("role") and "content" not in delta:
                delta["content"] = ""  # vLLM's first chunk: the role and an empty content
            self._choice(choice, "delta")

    def _usage_chunk(self) -> dict[str, Any]:
        prompt, completion = self.prompt_tokens, self.streamed_tokens
        head = self.stream_head
        return {
            "id": head.get("id"),
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": head.get("created"),
            "model": head.get("model"),
            "choices": [],
            "usage": {
                "prompt_tokens": prompt,
                "total_tokens": prompt + completion,
                "completion_tokens": completion,
            },
        }

    def error(self, status: int, data: bytes) -> tuple[int, bytes]:
        """A refusal of llama-cpp-python's as the client should see it: its pydantic refusals come back as
        HTTP 500 and are the client's mistake (400); other errors keep their status."""
        try:
            parsed = orjson.loads(data)
        except orjson.JSONDecodeError:
            return status, data
        err = parsed.get("error") if isinstance(parsed, dict) else None
        message = err.get("message") if isinstance(err, dict) else None
        if status == 500 and isinstance(message, str) and "validation error" in message:
            # Its message ends with a server-side traceback line; the client gets the checks only.
            head = message.split("\n\n  File ", 1)[0]
            return 400, ProxyError(400, f"The engine refused the request: {head}").body()
        return status, data


def _split(events: bytes) -> Iterator[bytes]:
    for event in events.split(b"\n\n"):
        if event:
            yield event
