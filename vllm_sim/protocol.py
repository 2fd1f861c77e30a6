"""Request validation with vLLM's error statuses, types and messages.

vLLM validates the body with pydantic (400, type "Bad Request", "N validation error(s): ...") and then
the sampling parameters and lengths (400, type "BadRequestError", message with a
"(parameter=..., value=...)" suffix, `param` set); an unknown model is a 404 NotFoundError.
See tests/data/vllm/endpoints.md, "Error JSON shape".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_sim import text


class ApiError(Exception):
    """An error answered in the OpenAI shape {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, err_type: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.err_type = err_type
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.err_type,
                "param": self.param,
                "code": self.status,
            }
        }


def validation_error(param: str | None, message: str, value: object = None) -> ApiError:
    """A VLLMValidationError: str() appends "(parameter=..., value=...)" for the parts that are set
    (vllm/exceptions.py); it answers 400 BadRequestError with `param`."""
    extras = []
    if param is not None:
        extras.append(f"parameter={param}")
    if value is not None:
        extras.append(f"value={value}")
    if extras:
        message = f"{message} ({', '.join(extras)})"
    return ApiError(400, "BadRequestError", message, param)


def body_error(kind: str, loc: str, msg: str, value: object, *, ctx: dict[str, Any] | None = None,
               param: str | None = None) -> ApiError:  # fmt: skip
    """A pydantic RequestValidationError as vLLM's handler renders it
    (exception_handling/handlers/validation.py:95-138): type is the reason phrase "Bad Request", the
    message lists each error dict as pydantic gives it (`loc` a tuple, `input` the value sent), `param`
    the dotted loc (clean_loc_for_param) unless a VLLMValidationError names one."""
    parts: tuple[object, ...] = ("body", *(int(p) if p.isdigit() else p for p in loc.split(".") if loc))
    detail: dict[str, Any] = {"type": kind, "loc": parts, "msg": msg, "input": value}
    if ctx is not None:
        detail["ctx"] = ctx
    loc_str = "body." + loc if loc else "body"
    return ApiError(400, "Bad Request", f"1 validation error:\n  {detail}", param or loc_str)


def validator_error(message: str, param: str | None, body: object, value: object = None) -> ApiError:
    """A VLLMValidationError raised inside a pydantic model_validator(mode="before"): pydantic wraps it as
    a value_error on the whole body, and vLLM's handler takes `param` from the wrapped exception."""
    text = str(validation_error(param, message, value))
    return body_error(
        "value_error",
        "",
        f"Value error, {text}",
        body,
        ctx={"error": _Repr(f"VLLMValidationError({message!r})")},
        param=param,
    )


class _Repr(str):
    """Printed as itself inside a dict: the exception object pydantic keeps in `ctx` shows its repr."""

    def __repr__(self) -> str:
        return str(self)


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_LOGPROB_TOKEN_IDS = 128  # sampling_params.py:30
EMPTY_PROMPT = "Either prompt or prompt_embeds must be provided and non-empty."
_MISSING = object()
_PARSE = {
    int: ("int_parsing", "Input should be a valid integer, unable to parse string as an integer"),
    float: ("float_parsing", "Input should be a valid number, unable to parse string as a number"),
    bool: ("bool_parsing", "Input should be a valid boolean, unable to interpret input"),
}


def _get(body: dict[str, Any], name: str, kinds: tuple[type, ...], default: Any = None) -> Any:
    """A field with pydantic's lax coercions (numeric strings, integral floats); wrong types are 400."""
    v = body.get(name, _MISSING)
    if v is _MISSING or v is None:
        return default
    kind = kinds[0]
    if kind is bool:
        if isinstance(v, bool):
            return v
        if v in (0, 1) and isinstance(v, int):
            return bool(v)
        if isinstance(v, str) and v.lower() in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            return v.lower() in ("true", "1", "yes", "on")
        raise body_error(_PARSE[bool][0], name, _PARSE[bool][1], v)
    if kind in (int, float) and isinstance(v, str):
        try:
            parsed = float(v) if kind is float else int(v)
        except ValueError:
            raise body_error(_PARSE[kind][0], name, _PARSE[kind][1], v) from None
        return parsed
    if kind is float and isinstance(v, (int, float)):
        return float(v)
    if kind is int and isinstance(v, float) and v.is_integer():
        return int(v)
    if kind is int and isinstance(v, float):
        raise body_error(
            "int_from_float", name, "Input should be a valid integer, got a number with a fractional part", v
        )
    if not isinstance(v, kinds):
        raise body_error(_kind(kinds), name, _msg(kinds), v)
    return v


def _kind(kinds: tuple[type, ...]) -> str:
    return {
        int: "int_type",
        float: "float_type",
        bool: "bool_type",
        str: "string_type",
        list: "list_type",
        dict: "dict_type",
    }.get(kinds[0], "type_error")


def _msg(kinds: tuple[type, ...]) -> str:
    return {
        int: "Input should be a valid integer",
        float: "Input should be a valid number",
        bool: "Input should be a valid boolean",
        str: "Input should be a valid string",
        list: "Input should be a valid list",
        dict: "Input should be a valid dictionary",
    }.get(kinds[0], "Input has the wrong type")


@dataclass
class SamplingRequest:
    """A validated /v1/chat/completions or /v1/completions request, reduced to what the engine needs."""

    model: str
    prompts: list[tuple[list[int], str]]  # (token ids, text) per prompt
    max_tokens: int | None
    n: int
    temperature: float
    seed: int | None
    stream: bool
    include_usage: bool
    continuous_usage: bool
    stop: tuple[str, ...]
    ignore_eos: bool
    min_tokens: int
    logprobs: int | None  # number of top alternatives; None when no logprobs were asked for
    echo: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    prompt_logprobs: int | None = None  # top-k per prompt token (vLLM extra parameter); None: not asked
    return_token_ids: bool = False  # vLLM extra parameter: token ids beside the text (streamed too)
    logit_bias: dict[int, float] | None = None  # token ids checked against the vocabulary by the engine
    allowed_token_ids: list[int] | None = None
    return_tokens_as_token_ids: bool = False  # logprobs name tokens "token_id:N"
    chat_echo: str = ""  # chat `echo`: the final assistant message's content, prefixed to the answer
    logprob_token_ids: list[int] | None = None  # logprobs of exactly these ids beside the sampled token
    role: str = "assistant"  # get_chat_request_role: the last message's role without a generation prompt
    beam: bool = False  # use_beam_search: the n choices are the n best beams
    length_penalty: float = 1.0  # beam search: a beam's score is cumulative logprob / length**penalty

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs is not None or bool(self.logprob_token_ids)


@dataclass
class ServingLimits:
    """Server settings that validation depends on."""

    served_names: list[str]
    max_model_len: int
    max_logprobs: int
    force_include_usage: bool = False
    tokenizer: text.PromptTokenizer = field(default_factory=text.PromptTokenizer)
    return_tokens_as_token_ids: bool = False  # --return-tokens-as-token-ids
    vocab_size: int = text.VOCAB_SIZE
    # --enable-auto-tool-choice with a --tool-call-parser: tool_choice "auto" is served.
    auto_tools: bool = False


def check_model(body: dict[str, Any], limits: ServingLimits) -> str:
    """Validate `model` (optional in vLLM) and return the name responses carry: vLLM answers with the
    first served name whichever alias was asked for (OpenAIServingModels.model_name())."""
    model = _get(body, "model", (str,))
    if model is not None and model not in limits.served_names:
        raise ApiError(404, "NotFoundError", f"The model `{model}` does not exist.", "model")
    return limits.served_names[0]


# Roles whose message may have `"content": null` (ChatCompletionAssistantMessageParam and the function
# message param type it Optional; every other message type, vLLM's custom one included, needs a string
# or a list of parts when the key is present).
NULL_CONTENT_ROLES = ("assistant", "function")


def messages_text(body: dict[str, Any]) -> tuple[list[dict[str, str]], bool]:
    if "messages" not in body:
        raise body_error("missing", "messages", "Field required", body)
    msgs = body["messages"]
    if not isinstance(msgs, list):
        raise body_error("list_type", "messages", "Input should be a valid list", msgs)
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise body_error("missing", f"messages.{i}.role", "Field required", m)
        content = m.get("content")
        if content is None:
            # vLLM's message types (OpenAI's plus a custom one with any role and an optional content)
            # let only an assistant (or function) message carry an explicit null; any role may leave
            # `content` out, which renders as empty.
            if "content" in m and m["role"] not in NULL_CONTENT_ROLES:
                raise body_error(
                    "string_type", f"messages.{i}.content", "Input should be a valid string", None
                )
            content = ""
        elif isinstance(content, list):
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text":
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise validation_error(
                        None, f"Unsupported content part type {kind!r}: this model accepts text only."
                    )
            content = text.content_text(content)
        elif not isinstance(content, str):
            raise body_error(
                "string_type", f"messages.{i}.content", "Input should be a valid string", content
            )
        out.append({"role": m["role"], "content": content})
    add_gen = _get(body, "add_generation_prompt", (bool,), True)
    return out, bool(add_gen)


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(stop)
    raise body_error("string_type", "stop", "Input should be a valid string", stop)


def _common(body: dict[str, Any], limits: ServingLimits, *, chat: bool) -> dict[str, Any]:
    n = _get(body, "n", (int,), 1)
    temperature = _get(body, "temperature", (float,), 1.0)
    top_p = _get(body, "top_p", (float,), 1.0)
    top_k = _get(body, "top_k", (int,), 0)
    min_p = _get(body, "min_p", (float,), 0.0)
    presence = _get(body, "presence_penalty", (float,), 0.0)
    frequency = _get(body, "frequency_penalty", (float,), 0.0)
    repetition = _get(body, "repetition_penalty", (float,), 1.0)
    seed = _get(body, "seed", (int,), None)
    if seed is not None and not INT64_MIN <= seed <= INT64_MAX:
        # Field(None, ge=_LONG_INFO.min, le=_LONG_INFO.max) (chat_completion/protocol.py:231).
        bound, kind, word = (INT64_MAX, "less_than_equal", "less") if seed > 0 else (
            INT64_MIN, "greater_than_equal", "greater")  # fmt: skip
        raise body_error(
            kind, "seed", f"Input should be {word} than or equal to {bound}", seed,
            ctx={"le" if seed > 0 else "ge": bound},
        )  # fmt: skip
    logit_bias = _logit_bias(body)
    allowed = _token_id_list(body, "allowed_token_ids")
    # dict[str, Any] | None. Without --kv-transfer-config (no KV connector, which the simulator does not
    # model) vLLM answers kv_transfer_params: null whatever the request sent.
    _get(body, "kv_transfer_params", (dict,), None)
    stream = bool(_get(body, "stream", (bool,), False))
    stream_options = _get(body, "stream_options", (dict,), None)
    ignore_eos = bool(_get(body, "ignore_eos", (bool,), False))
    min_tokens = _get(body, "min_tokens", (int,), 0)
    if chat:
        mct = _get(body, "max_completion_tokens", (int,), None)
        max_tokens = mct if mct is not None else _get(body, "max_tokens", (int,), None)
        max_param = "max_completion_tokens" if mct is not None else "max_tokens"
    else:
        # `max_tokens: int | None = 16` (completion/protocol.py:61): an explicit null means no limit.
        max_tokens = None if "max_tokens" in body and body["max_tokens"] is None else _get(
            body, "max_tokens", (int,), 16)  # fmt: skip
        max_param = "max_tokens"
    if stream_options and not stream:
        raise validator_error(
            "Stream options can only be defined when `stream=True`.", "stream_options", body
        )
    if max_tokens is not None and max_tokens > limits.max_model_len:
        raise validation_error(
            max_param,
            f"{max_param}={max_tokens} cannot be greater than max_model_len=max_total_tokens="
            f"{limits.max_model_len}. Please request fewer output tokens.",
            max_tokens,
        )
    stop = _stop(body)
    sampling = {
        "n": n, "presence": presence, "frequency": frequency, "repetition": repetition,
        "temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p,
        "max_tokens": max_tokens, "min_tokens": min_tokens, "stop": stop,
    }  # fmt: skip
    # should_include_usage (serve/utils/api_utils.py:289-293): --enable-force-include-usage puts usage
    # in every chunk; otherwise continuous usage needs include_usage too.
    include_usage, continuous = False, False
    if limits.force_include_usage:
        include_usage, continuous = True, True
    elif stream_options:
        include_usage = bool(stream_options.get("include_usage"))
        continuous = include_usage and bool(stream_options.get("continuous_usage_stats"))
    beam = bool(_get(body, "use_beam_search", (bool,), False))
    if beam and stream:
        raise validator_error("Streaming is not currently supported with beam search", "stream", body)
    return {
        "n": n,
        "beam": beam,
        "length_penalty": _get(body, "length_penalty", (float,), 1.0),
        "temperature": temperature,
        "seed": seed,
        "stream": stream,
        "include_usage": include_usage,
        "continuous_usage": continuous,
        "stop": tuple(x for x in stop if x),
        "ignore_eos": ignore_eos,
        "min_tokens": min_tokens,
        "max_tokens": max_tokens,
        "max_param": max_param,
        "sampling": sampling,
        "logit_bias": logit_bias,
        "allowed_token_ids": allowed,
        "return_tokens_as_token_ids": bool(_get(body, "return_tokens_as_token_ids", (bool,), False))
        or limits.return_tokens_as_token_ids,
    }


def verify_sampling(sp: dict[str, Any], logprobs: int | None) -> None:
    """SamplingParams._verify_args and _verify_greedy_sampling, in vLLM's order and wording; only some
    of vLLM's checks name a parameter (those get `param` and the "(parameter=...)" suffix)."""
    n, temperature, top_p = sp["n"], sp["temperature"], sp["top_p"]
    max_tokens, min_tokens = sp["max_tokens"], sp["min_tokens"]
    if n < 1:
        raise validation_error(None, f"n must be at least 1, got {n}.")
    if not -2.0 <= sp["presence"] <= 2.0:
        raise validation_error(None, f"presence_penalty must be in [-2, 2], got {sp['presence']}.")
    if not -2.0 <= sp["frequency"] <= 2.0:
        raise validation_error(None, f"frequency_penalty must be in [-2, 2], got {sp['frequency']}.")
    if sp["repetition"] <= 0.0:
        raise validation_error(None, f"repetition_penalty must be greater than zero, got {sp['repetition']}.")
    if temperature < 0.0:
        raise validation_error(
            "temperature", f"temperature must be non-negative, got {temperature}.", temperature
        )
    if temperature > 2.0:
        raise validation_error(
            "temperature", f"temperature must be in [0, 2], got {temperature}.", temperature
        )
    if not 0.0 < top_p <= 1.0:
        raise validation_error("top_p", f"top_p must be in (0, 1], got {top_p}.", top_p)
    if sp["top_k"] < -1:
        raise validation_error(None, f"top_k must be 0 (disable), or at least 1, got {sp['top_k']}.")
    if not 0.0 <= sp["min_p"] <= 1.0:
        raise validation_error(None, f"min_p must be in [0, 1], got {sp['min_p']}.")
    if max_tokens is not None and max_tokens < 1:
        raise validation_error("max_tokens", f"max_tokens must be at least 1, got {max_tokens}.", max_tokens)
    if min_tokens < 0:
        raise validation_error(None, f"min_tokens must be greater than or equal to 0, got {min_tokens}.")
    if max_tokens is not None and min_tokens > max_tokens:
        raise validation_error(
            None, f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}."
        )
    if logprobs is not None and logprobs != -1 and logprobs < 0:
        raise validation_error("logprobs", f"logprobs must be non-negative or -1, got {logprobs}.", logprobs)
    if any(not x for x in sp["stop"]):
        raise validation_error(None, "stop cannot contain an empty string.")
    if temperature < 1e-5 and n > 1:
        raise validation_error(None, f"n must be 1 when using greedy sampling, got {n}.")


def _check_lengths(
    prompts: list[tuple[list[int], str]], max_tokens: int | None, limits: ServingLimits, token_input: bool
) -> None:
    mml = limits.max_model_len
    max_out = max_tokens or 0
    max_in = mml - max_out
    for ids, _ in prompts:
        if len(ids) > max_in:
            # A text prompt is tokenized with max_length = max_input_tokens + 1 (params.py:314-325), so
            # its count is that; "at least" is written whenever the count is exactly that
            # (params.py:437-455), token-id prompts of that length included.
            count = len(ids) if token_input else max_in + 1
            at_least = "at least " if count == max_in + 1 else ""
            raise validation_error(
                "input_tokens",
                f"This model's maximum context length is {mml} tokens. However, you requested {max_out} "
                f"output tokens and your prompt contains {at_least}{count} input tokens, for a total of "
                f"{at_least}{count + max_out} tokens. Please reduce the length of the input prompt or the "
                "number of requested output tokens.",
                count,
            )


def parse_chat(body: Any, limits: ServingLimits) -> SamplingRequest:
    """Validate a chat completion body; raises ApiError with vLLM's status and wording."""
    if not isinstance(body, dict):
        raise body_error("model_attributes_type", "", "Input should be a valid dictionary or object", body)
    model = check_model(body, limits)
    messages, add_gen = messages_text(body)
    continue_final = bool(_get(body, "continue_final_message", (bool,), False))
    if continue_final and body.get("add_generation_prompt"):
        both = "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
        # A VLLMValidationError without a parameter (chat_completion/protocol.py:990-994).
        raise validator_error(both, None, body)
    check_logprobs(body, chat=True)
    check_tools(body, limits.auto_tools)
    c = _common(body, limits, chat=True)
    _response_format(body)
    logprobs = bool(_get(body, "logprobs", (bool,), False))
    top = _get(body, "top_logprobs", (int,), None)
    lp_ids = _token_id_list(body, "logprob_token_ids")
    # to_sampling_params (chat_completion/protocol.py:725-730): top_logprobs unless logprob_token_ids.
    n_logprobs = (top or 0) if logprobs and not lp_ids else None
    prompt_lp = _get(body, "prompt_logprobs", (int,), None)
    return_ids = bool(_get(body, "return_token_ids", (bool,), False))
    trunc = _truncation(body, limits, c["max_tokens"], c["max_param"])
    if continue_final:
        # The final (assistant) message stays open: the answer continues it (no end-of-turn token).
        prompt = text.render_chat(messages, False)
        if messages and prompt.endswith("<|eot_id|>"):
            prompt = prompt[: -len("<|eot_id|>")]
    else:
        prompt = text.render_chat(messages, add_gen)
    # chat_completion/serving.py:398-401: the response role, or the last message's without a generation
    # prompt.
    role = "assistant" if add_gen or not messages else messages[-1]["role"]
    echo = ""
    if _get(body, "echo", (bool,), False) and messages and messages[-1]["role"] == role:
        # chat_completion/serving.py:1080-1090: echo prefixes the last message when it has that role.
        echo = messages[-1]["content"]
    if trunc is None:
        _check_chars(prompt, c["max_tokens"], limits)
    ids = limits.tokenizer.encode_rendered(prompt)
    reused = _reused_prompt_ids(body)
    if reused is not None:
        # The ids as the prompt, verbatim: no template, no tokenizer, and no conversation to echo.
        ids, prompt, echo = reused, limits.tokenizer.decode(reused), ""
    prompts = [_truncate(ids, prompt, trunc, limits)]
    _check_lengths(prompts, c["max_tokens"], limits, token_input=trunc is not None)
    c["logit_bias"] = convert_logit_bias(c["logit_bias"])
    if not c["beam"]:  # beam search builds BeamSearchParams, which SamplingParams' checks never see
        verify_sampling(c["sampling"], n_logprobs)
    return SamplingRequest(
        model=model,
        prompts=prompts,
        logprobs=n_logprobs,
        prompt_logprobs=prompt_lp,
        return_token_ids=return_ids,
        chat_echo=echo,
        logprob_token_ids=lp_ids,
        role=role,
        **_strip(c),
    )


def _reused_prompt_ids(body: dict[str, Any]) -> list[int] | None:
    """`kv_transfer_params.prompt_token_ids` of a chat request: in disaggregated serving the decode stage
    gets the prefill stage's prompt ids there and vLLM uses them as the prompt instead of rendering the
    messages (vllm/renderers/online_renderer.py `_reused_prompt_token_ids` and `preprocess_chat`, at
    01063cd0), unless a message carries media (chat_completion/protocol.py
    `drop_prompt_token_ids_with_media`)."""
    kv = body.get("kv_transfer_params")
    ids = kv.get("prompt_token_ids") if isinstance(kv, dict) else None
    if not ids or not isinstance(ids, list) or not all(type(t) is int for t in ids):
        return None
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(
            isinstance(part, dict) and part.get("type") != "text" for part in content
        ):
            return None
    return ids


def parse_batch_chat(body: dict[str, Any]) -> list[list[Any]]:
    """BatchChatCompletionRequest (chat_completion/protocol.py:1047-1156): its check_batch_mode
    validator first, then `messages` as a non-empty list of non-empty conversations."""
    if body.get("use_beam_search"):
        raise validator_error(
            "Batch chat completions do not support beam search. Please set `use_beam_search` to False.",
            "use_beam_search",
            body,
        )
    if body.get("logprob_token_ids") and not body.get("logprobs"):
        raise validator_error(
            "when using `logprob_token_ids`, `logprobs` must be set to true.", "logprob_token_ids", body
        )
    n = body.get("n", 1)
    if n is not None and n != 1:
        raise validator_error(
            "Batch chat completions do not support `n > 1`. Please set `n` to 1.", "n", body, n
        )
    if "messages" not in body:
        raise body_error("missing", "messages", "Field required", body)
    convs = body["messages"]
    if not isinstance(convs, list):
        raise body_error("list_type", "messages", "Input should be a valid list", convs)
    too_short = "List should have at least 1 item after validation, not 0"
    ctx = {"field_type": "List", "min_length": 1, "actual_length": 0}
    if not convs:
        raise body_error("too_short", "messages", too_short, convs, ctx=ctx)
    for i, conv in enumerate(convs):
        if not isinstance(conv, list):
            raise body_error("list_type", f"messages.{i}", "Input should be a valid list", conv)
        if not conv:
            raise body_error("too_short", f"messages.{i}", too_short, conv, ctx=ctx)
    return convs


def parse_completion(body: Any, limits: ServingLimits) -> SamplingRequest:
    """Validate a completion body (prompt: str, [str], [int] or [[int]])."""
    if not isinstance(body, dict):
        raise body_error("model_attributes_type", "", "Input should be a valid dictionary or object", body)
    check_logprobs(body, chat=False)
    model = check_model(body, limits)
    raw = body.get("prompt")
    if raw is None or (isinstance(raw, (str, list)) and len(raw) == 0):
        # CompletionRequest's model validator (completion/protocol.py:560-572): `prompt` is optional
        # (prompt_embeds is the alternative) but one of them must be non-empty.
        raise validator_error(EMPTY_PROMPT, "prompt", body)
    token_input = False
    texts: list[str] = []
    token_prompts: list[list[int]] = []
    if isinstance(raw, str):
        texts = [raw]
    elif isinstance(raw, list) and all(isinstance(p, str) for p in raw):
        texts = list(raw)
    elif isinstance(raw, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        token_prompts = [list(raw)]
        token_input = True
    elif (
        isinstance(raw, list)
        and all(isinstance(p, list) and p for p in raw)
        and all(isinstance(t, int) and not isinstance(t, bool) for p in raw for t in p)
    ):
        token_prompts = [list(p) for p in raw]
        token_input = True
    else:
        raise validation_error(
            "prompt", "Prompt must be a string, a list of strings or a list of token ids.", raw
        )
    if body.get("suffix") is not None:
        raise validation_error("suffix", "suffix is not currently supported", body.get("suffix"))
    c = _common(body, limits, chat=False)
    lp_ids = _token_id_list(body, "logprob_token_ids")
    # to_sampling_params (completion/protocol.py:381): logprobs unless logprob_token_ids.
    lp = None if lp_ids else _get(body, "logprobs", (int,), None)
    prompt_lp = _get(body, "prompt_logprobs", (int,), None)
    return_ids = bool(_get(body, "return_token_ids", (bool,), False))
    echo = bool(_get(body, "echo", (bool,), False))
    trunc = _truncation(body, limits, c["max_tokens"], c["max_param"])
    prompts: list[tuple[list[int], str]] = []
    for t in texts:
        if trunc is None:
            _check_chars(t, c["max_tokens"], limits)
        prompts.append(_truncate(limits.tokenizer.encode_prompt(t), t, trunc, limits))
    for ids in token_prompts:
        prompts.append(_truncate(ids, limits.tokenizer.decode(ids), trunc, limits))
    _check_lengths(prompts, c["max_tokens"], limits, token_input=token_input or trunc is not None)
    c["logit_bias"] = convert_logit_bias(c["logit_bias"])
    if not c["beam"]:
        verify_sampling(c["sampling"], lp)
    return SamplingRequest(
        model=model,
        prompts=prompts,
        logprobs=lp,
        echo=echo,
        prompt_logprobs=prompt_lp,
        return_token_ids=return_ids,
        logprob_token_ids=lp_ids,
        **_strip(c),
    )


# The response_format types a chat request may name (ResponseFormat and StructuralTagResponseFormat in
# chat_completion/protocol.py: `type: Literal[...]`); another is a pydantic literal_error, a 400.
RESPONSE_FORMATS = ("text", "json_object", "json_schema", "structural_tag")


def _response_format(body: dict[str, Any]) -> None:
    fmt = body.get("response_format")
    if fmt is None:
        return
    if not isinstance(fmt, dict):
        raise body_error("model_attributes_type", "response_format", "Input should be a valid dictionary or "
                         "object to extract fields from", fmt)  # fmt: skip
    kind = fmt.get("type")
    if kind not in RESPONSE_FORMATS:
        expected = ", ".join(f"'{k}'" for k in RESPONSE_FORMATS[:-1]) + f" or '{RESPONSE_FORMATS[-1]}'"
        raise body_error("literal_error", "response_format.type", f"Input should be {expected}", kind,
                         ctx={"expected": expected})  # fmt: skip


AUTO_TOOLS = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'


def check_tools(body: dict[str, Any], auto_tools: bool) -> None:
    """ChatCompletionRequest's check_tool_usage validator (before field validation, so its refusals are
    pydantic's "Value error, ..."), then the serving layer's refusal of tool_choice "auto" on a server
    without a tool-call parser, a plain 400 with vLLM's wording. tool_choice defaults to "auto" when
    tools are given. The simulator generates text only: a served "auto" answers without calling a tool,
    as a model may; a named tool choice or "required" is answered as text too (not simulated)."""
    tools = body.get("tools")
    choice = body.get("tool_choice", "auto" if tools else None)
    if choice is None or choice == "none":
        return
    if not tools:
        raise validator_error("When using `tool_choice`, `tools` must be set.", "tool_choice", body)
    if choice not in ("auto", "required") and not isinstance(choice, dict):
        raise validator_error(
            f'Invalid value for `tool_choice`: {choice}! Only named tools, "none", "auto" or '
            '"required" are supported.',
            "tool_choice",
            body,
        )
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        names = [(t.get("function") or {}).get("name") for t in tools if isinstance(t, dict)]
        if name not in names:
            raise validator_error(f"Tool '{name}' has not been passed in `tools`.", "tool_choice", body)
    if choice == "auto" and not auto_tools:
        raise ApiError(400, "BadRequestError", AUTO_TOOLS)


def check_logprobs(body: dict[str, Any], *, chat: bool) -> None:
    """The check_logprobs model validator of ChatCompletionRequest (chat_completion/protocol.py:794-850)
    and CompletionRequest (completion/protocol.py:476-540), in its order and wording. It runs on the raw
    body before field validation, so a numeric string is refused here although pydantic would coerce it."""
    ids = body.get("logprob_token_ids")
    if ids and body.get("use_beam_search"):
        raise validator_error(
            "`logprob_token_ids` is not supported with beam search.", "logprob_token_ids", body
        )
    if chat:
        if ids and not body.get("logprobs"):
            raise validator_error(
                "when using `logprob_token_ids`, `logprobs` must be set to true.", "logprob_token_ids", body
            )
    else:
        if ids and body.get("echo") and body.get("max_tokens") == 0:
            raise validator_error(
                "`logprob_token_ids` is not supported when `echo=True` and `max_tokens=0` because no "
                "output tokens are generated.",
                "logprob_token_ids",
                body,
            )
        if ids and body.get("logprobs") is None:
            raise validator_error(
                "when using `logprob_token_ids`, `logprobs` must be set.", "logprob_token_ids", body
            )
    sample = "top_logprobs" if chat else "logprobs"
    for name in ("prompt_logprobs", sample):
        value = body.get(name)
        if value is not None and not isinstance(value, (int, float)):
            raise validator_error(f"`{name}` must be an integer.", name, body, value)
    prompt_lp = body.get("prompt_logprobs")
    if prompt_lp is not None:
        if body.get("stream") and (prompt_lp > 0 or prompt_lp == -1):
            raise validator_error(
                "`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs", body
            )
        if prompt_lp < 0 and prompt_lp != -1:
            raise validator_error(
                "`prompt_logprobs` must be a positive value or -1.", "prompt_logprobs", body, prompt_lp
            )
    value = body.get(sample)
    if value is not None and value < 0 and value != -1:
        raise validator_error(f"`{sample}` must be a positive value or -1.", sample, body, value)
    if chat and value is not None and (value == -1 or value > 0) and not body.get("logprobs"):
        raise validator_error(
            "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs", body
        )


def _truncation(
    body: dict[str, Any], limits: ServingLimits, max_tokens: int | None, max_param: str
) -> tuple[int, str | None] | None:
    """`truncate_prompt_tokens` (Field(ge=-1, le=int64 max)) and `truncation_side` ("left" | "right"),
    checked as TokenizeParams.__post_init__ does (renderers/params.py:239-251); -1 means
    max_input_tokens. None when the prompt is not to be truncated."""
    k = _get(body, "truncate_prompt_tokens", (int,), None)
    side = body.get("truncation_side")
    if side is not None and side not in ("left", "right"):
        raise body_error(
            "literal_error", "truncation_side", "Input should be 'left' or 'right'", side,
            ctx={"expected": "'left' or 'right'"},
        )  # fmt: skip
    if k is None:
        return None
    if k < -1:
        raise body_error(
            "greater_than_equal", "truncate_prompt_tokens", "Input should be greater than or equal to -1",
            k, ctx={"ge": -1},
        )  # fmt: skip
    max_in = limits.max_model_len - (max_tokens or 0)
    if k > max_in:
        raise validation_error(
            "truncate_prompt_tokens",
            f"truncate_prompt_tokens={k} cannot be greater than max_model_len - {max_param} = {max_in}. "
            "Please request a smaller truncation size.",
            k,
        )
    return (max_in if k == -1 else k), side


def _truncate(
    ids: list[int], prompt: str, trunc: tuple[int, str | None] | None, limits: ServingLimits
) -> tuple[list[int], str]:
    """TokenizeParams._token_truncation (renderers/params.py:407-425): keep k tokens, the last ones with
    truncation_side "left", else the first (the tokenizer's default side, "right" for Hugging Face
    tokenizers without a truncation_side setting)."""
    if trunc is None or trunc[0] >= len(ids):
        return ids, prompt
    k, side = trunc
    kept = ids[len(ids) - k :] if side == "left" else ids[:k]
    return kept, limits.tokenizer.decode(kept)


def _all_vocab(n: int, vocab: int) -> int:
    """-1 asks for the log-probabilities of the whole vocabulary."""
    return vocab if n == -1 else n


def _strip(c: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in c.items() if k not in ("max_param", "sampling")}


def _logit_bias(body: dict[str, Any]) -> dict[str, float] | None:
    """The pydantic side of `logit_bias: dict[str, float] | None`: values must be numbers (numeric
    strings pass, lax mode); the keys are checked later, by SamplingParams.from_optional."""
    raw = body.get("logit_bias")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise body_error("dict_type", "logit_bias", "Input should be a valid dictionary", raw)
    out: dict[str, float] = {}
    for key, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise body_error("float_type", f"logit_bias.{key}", "Input should be a valid number", value)
        try:
            out[key] = float(value)
        except ValueError:
            raise body_error(_PARSE[float][0], f"logit_bias.{key}", _PARSE[float][1], value) from None
    return out


def convert_logit_bias(raw: dict[str, float] | None) -> dict[int, float] | None:
    """SamplingParams.from_optional (sampling_params.py:418-443): keys to int token ids (a key int()
    refuses is a 400 naming every such key), biases clamped to [-100, 100]."""
    if raw is None:
        return None
    out: dict[int, float] = {}
    invalid: list[str] = []
    for key, bias in raw.items():
        try:
            out[int(key)] = min(100.0, max(-100.0, bias))
        except ValueError:
            invalid.append(key)
    if invalid:
        raise validation_error(
            "logit_bias",
            f"logit_bias contains key(s) that cannot be converted to integer token IDs: {invalid!r}",
            invalid,
        )
    return out


def _token_id_list(body: dict[str, Any], name: str) -> list[int] | None:
    """A `list[int] | None` field, with pydantic's errors."""
    raw = body.get(name)
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise body_error("list_type", name, "Input should be a valid list", raw)
    out = []
    for i, v in enumerate(raw):
        if isinstance(v, bool) or not isinstance(v, int):
            raise body_error(_kind((int,)), f"{name}.{i}", _msg((int,)), v)
        out.append(v)
    return out


def engine_checks(req: SamplingRequest, limits: ServingLimits) -> None:
    """What vLLM's engine checks when the request reaches it (InputProcessor: the sampling parameters
    against the vocabulary, then each prompt), after the response has begun: in a stream these errors
    arrive as an SSE error event, not as a 400."""
    vocab = limits.vocab_size
    # SamplingParams._validate_logprobs (sampling_params.py:791-860), then _validate_logit_bias and
    # _validate_allowed_token_ids: run by the engine's InputProcessor, so a stream gets them as an event.
    max_lp = vocab if limits.max_logprobs == -1 else limits.max_logprobs
    if req.logprobs:
        n = _all_vocab(req.logprobs, vocab)
        if n > max_lp:
            raise validation_error(
                "logprobs",
                f"Requested sample logprobs of {n}, which is greater than max allowed: {max_lp}",
                n,
            )
    if req.logprob_token_ids is not None:
        n = len(req.logprob_token_ids)
        if n > MAX_LOGPROB_TOKEN_IDS:
            raise validation_error(
                "logprob_token_ids",
                f"Requested logprob_token_ids of length {n}, which is greater than max allowed: "
                f"{MAX_LOGPROB_TOKEN_IDS}",
                n,
            )
        bad = [t for t in req.logprob_token_ids if t < 0 or t >= vocab]
        if bad:
            raise validation_error(
                "logprob_token_ids",
                f"token_id(s) {bad} in logprob_token_ids contain out-of-vocab token ids. Vocabulary size: "
                f"{vocab}",
                bad,
            )
    if req.prompt_logprobs:
        n = _all_vocab(req.prompt_logprobs, vocab)
        if n > max_lp:
            raise validation_error(
                "prompt_logprobs",
                f"Requested prompt logprobs of {n}, which is greater than max allowed: {max_lp}",
                n,
            )
    if req.logit_bias:
        bad = [t for t in req.logit_bias if t < 0 or t >= vocab]
        if bad:  # sampling_params.py:862-880 (_validate_logit_bias)
            raise validation_error(
                "logit_bias",
                f"token_id(s) {bad} in logit_bias contain out-of-vocab token ids. Vocabulary size: {vocab}",
                bad,
            )
    if req.allowed_token_ids is not None:  # _validate_allowed_token_ids
        if not req.allowed_token_ids:
            raise validation_error("allowed_token_ids", "allowed_token_ids is not None and empty!", [])
        bad = [t for t in req.allowed_token_ids if t < 0 or t >= vocab]
        if bad:
            raise validation_error(
                "allowed_token_ids", "allowed_token_ids contains out-of-vocab token id!", bad
            )
    mml = limits.max_model_len
    for ids, _ in req.prompts:
        # v1/engine/input_processor.py: _validate_prompt_len, then the out-of-vocabulary check (533-545).
        if not ids:
            raise validation_error(None, "The decoder prompt cannot be empty")
        if len(ids) == mml:
            raise validation_error(
                None,
                f"The decoder prompt (length {len(ids)}) plus the number of requested output tokens "
                f"(at least 1) is longer than the maximum model length of {mml}. Make sure that "
                "`max_model_len` is no smaller than the number of text tokens (prompt + requested output "
                "tokens).",
            )
        low, top = min(ids), max(ids)
        if low < 0:  # input_processor.py:533-541: a negative id is out of vocabulary too
            raise validation_error(None, f"Token id {low} is out of vocabulary")
        if top > max(limits.tokenizer.max_token_id, vocab - 1):
            raise validation_error(None, f"Token id {top} is out of vocabulary")


def _check_chars(prompt: str, max_tokens: int | None, limits: ServingLimits) -> None:
    """TokenizeParams._text_len_check (renderers/params.py:342-370): text longer than the most
    characters max_input_tokens tokens can hold is refused before tokenizing."""
    mml = limits.max_model_len
    max_out = max_tokens or 0
    max_in = mml - max_out
    bound = max_in * limits.tokenizer.max_chars_per_token
    if len(prompt) > bound:
        raise validation_error(
            "input_text",
            f"This model's maximum context length is {mml} tokens. However, you requested {max_out} "
            f"output tokens and your prompt contains {len(prompt)} characters (more than {bound} "
            f"characters, which is the upper bound for {max_in} input tokens). Please reduce the length "
            "of the input prompt or the number of requested output tokens.",
            len(prompt),
        )
