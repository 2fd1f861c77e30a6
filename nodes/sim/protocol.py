"""Request validation with vLLM's error statuses, types and messages.

vLLM validates the body with pydantic (400, type "Bad Request", "N validation error(s): ...") and then
the sampling parameters and lengths (400, type "BadRequestError", message with a
"(parameter=..., value=...)" suffix, `param` set); an unknown model is a 404 NotFoundError.
See tests/data/vllm/endpoints.md, "Error JSON shape".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nodes.sim import text


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


def _summarize_input(value: object) -> object:
    """vLLM's validation handler echoes inputs bounded: containers are described, long text is cut."""
    if isinstance(value, str):
        return value[:200] + "...[truncated]" if len(value) > 200 else value
    if isinstance(value, (list, tuple, dict)):
        return f"<{type(value).__name__} of {len(value)} items>"
    return str(value)


def body_error(kind: str, loc: str, msg: str, value: object, *, ctx: dict[str, Any] | None = None,
               param: str | None = None) -> ApiError:  # fmt: skip
    """A pydantic RequestValidationError as vLLM's handler renders it: type is the reason phrase
    "Bad Request", the message lists the error with its dotted loc, `param` is that loc."""
    loc_str = "body." + loc if loc else "body"
    detail: dict[str, Any] = {"type": kind, "loc": loc_str, "msg": msg, "input": _summarize_input(value)}
    if ctx is not None:
        detail["ctx"] = ctx
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
        ctx={"error": f"VLLMValidationError({message!r})"},
        param=param,
    )


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


@dataclass
class ServingLimits:
    """Server settings that validation depends on."""

    served_names: list[str]
    max_model_len: int
    max_logprobs: int
    force_include_usage: bool = False
    tokenizer: text.PromptTokenizer = field(default_factory=text.PromptTokenizer)


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
    stream = bool(_get(body, "stream", (bool,), False))
    stream_options = _get(body, "stream_options", (dict,), None)
    ignore_eos = bool(_get(body, "ignore_eos", (bool,), False))
    min_tokens = _get(body, "min_tokens", (int,), 0)
    if chat:
        mct = _get(body, "max_completion_tokens", (int,), None)
        max_tokens = mct if mct is not None else _get(body, "max_tokens", (int,), None)
        max_param = "max_completion_tokens" if mct is not None else "max_tokens"
    else:
        max_tokens = _get(body, "max_tokens", (int,), 16)
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
    include_usage = limits.force_include_usage
    continuous = False
    if stream_options:
        include_usage = include_usage or bool(stream_options.get("include_usage"))
        continuous = bool(stream_options.get("continuous_usage_stats"))
    return {
        "n": n,
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
            count = len(ids) if token_input else max_in + 1
            at_least = "" if token_input else "at least "
            raise validation_error(
                "input_tokens",
                f"This model's maximum context length is {mml} tokens. However, you requested {max_out} "
                f"output tokens and your prompt contains {at_least}{count} input tokens, for a total of "
                f"{at_least}{count + max_out} tokens. Please reduce the length of the input prompt or the "
                "number of requested output tokens.",
                count,
            )
        if max_tokens is None and len(ids) >= mml:
            raise validation_error(
                None,
                f"The decoder prompt (length {len(ids)}) plus the number of requested output tokens "
                f"(at least 1) is longer than the maximum model length of {mml}. Make sure that "
                "`max_model_len` is no smaller than the number of text tokens plus the number of requested "
                "output tokens.",
            )


def parse_chat(body: Any, limits: ServingLimits) -> SamplingRequest:
    """Validate a chat completion body; raises ApiError with vLLM's status and wording."""
    if not isinstance(body, dict):
        raise body_error("model_attributes_type", "", "Input should be a valid dictionary or object", body)
    model = check_model(body, limits)
    messages, add_gen = messages_text(body)
    c = _common(body, limits, chat=True)
    logprobs = bool(_get(body, "logprobs", (bool,), False))
    top = _get(body, "top_logprobs", (int,), None)
    if top is not None and top < 0 and top != -1:
        raise validator_error("`top_logprobs` must be a positive value or -1.", "top_logprobs", body, top)
    if top is not None and (top == -1 or top > 0) and not logprobs:
        raise validator_error(
            "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs", body
        )
    n_logprobs = (top or 0) if logprobs else None
    if n_logprobs is not None and limits.max_logprobs != -1 and _all_vocab(n_logprobs) > limits.max_logprobs:
        raise validation_error(
            "logprobs",
            f"Requested sample logprobs of {n_logprobs}, which is greater than max allowed: "
            f"{limits.max_logprobs}",
            n_logprobs,
        )
    prompt_lp = _prompt_logprobs(body, limits)
    return_ids = bool(_get(body, "return_token_ids", (bool,), False))
    prompt = text.render_chat(messages, add_gen)
    ids = limits.tokenizer.encode_rendered(prompt)
    prompts = [(ids, prompt)]
    _check_lengths(prompts, c["max_tokens"], limits, token_input=False)
    verify_sampling(c["sampling"], n_logprobs)
    return SamplingRequest(
        model=model,
        prompts=prompts,
        logprobs=n_logprobs,
        prompt_logprobs=prompt_lp,
        return_token_ids=return_ids,
        **_strip(c),
    )


def parse_completion(body: Any, limits: ServingLimits) -> SamplingRequest:
    """Validate a completion body (prompt: str, [str], [int] or [[int]])."""
    if not isinstance(body, dict):
        raise body_error("model_attributes_type", "", "Input should be a valid dictionary or object", body)
    model = check_model(body, limits)
    if "prompt" not in body or body["prompt"] is None:
        raise body_error("missing", "prompt", "Field required", body)
    raw = body["prompt"]
    token_input = False
    prompts: list[tuple[list[int], str]] = []
    if isinstance(raw, str):
        prompts = [(limits.tokenizer.encode_prompt(raw), raw)]
    elif isinstance(raw, list) and raw and all(isinstance(p, str) for p in raw):
        prompts = [(limits.tokenizer.encode_prompt(p), p) for p in raw]
    elif isinstance(raw, list) and raw and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        prompts = [(list(raw), limits.tokenizer.decode(raw))]
        token_input = True
    elif (
        isinstance(raw, list)
        and raw
        and all(isinstance(p, list) and p for p in raw)
        and all(isinstance(t, int) and not isinstance(t, bool) for p in raw for t in p)
    ):
        prompts = [(list(p), limits.tokenizer.decode(p)) for p in raw]
        token_input = True
    else:
        raise validation_error(
            "prompt", "Prompt must be a string, a list of strings or a list of token ids.", raw
        )
    if body.get("suffix") is not None:
        raise validation_error("suffix", "suffix is not currently supported", body.get("suffix"))
    c = _common(body, limits, chat=False)
    lp = _get(body, "logprobs", (int,), None)
    if lp is not None and limits.max_logprobs != -1 and _all_vocab(lp) > limits.max_logprobs:
        raise validation_error(
            "logprobs",
            f"Requested sample logprobs of {lp}, which is greater than max allowed: {limits.max_logprobs}",
            lp,
        )
    prompt_lp = _prompt_logprobs(body, limits)
    return_ids = bool(_get(body, "return_token_ids", (bool,), False))
    echo = bool(_get(body, "echo", (bool,), False))
    _check_lengths(prompts, c["max_tokens"], limits, token_input=token_input)
    verify_sampling(c["sampling"], lp)
    return SamplingRequest(
        model=model,
        prompts=prompts,
        logprobs=lp,
        echo=echo,
        prompt_logprobs=prompt_lp,
        return_token_ids=return_ids,
        **_strip(c),
    )


def _prompt_logprobs(body: dict[str, Any], limits: ServingLimits) -> int | None:
    """vLLM's check_logprobs model validator for `prompt_logprobs`, then the processor's max_logprobs
    check (an extra parameter of both endpoints; never returned in a stream)."""
    value = _get(body, "prompt_logprobs", (int,), None)
    if value is None:
        return None
    if body.get("stream") and (value > 0 or value == -1):
        raise validator_error(
            "`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs", body
        )
    if value < 0 and value != -1:
        raise validator_error(
            "`prompt_logprobs` must be a positive value or -1.", "prompt_logprobs", body, value
        )
    if value and limits.max_logprobs != -1 and _all_vocab(value) > limits.max_logprobs:
        raise validation_error(
            "prompt_logprobs",
            f"Requested prompt logprobs of {_all_vocab(value)}, which is greater than max allowed: "
            f"{limits.max_logprobs}",
            _all_vocab(value),
        )
    return value


def _all_vocab(n: int) -> int:
    """-1 asks for the log-probabilities of the whole vocabulary."""
    return text.VOCAB_SIZE if n == -1 else n


def _strip(c: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in c.items() if k not in ("max_param", "sampling")}
