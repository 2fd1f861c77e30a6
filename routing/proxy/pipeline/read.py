"""Step 2, read and validate: the JSON body, OpenAI's field checks, the model, priority and output cap."""

from __future__ import annotations

from typing import Any

import orjson

from routing.choices import Priority
from routing.proxy.errors import ProxyError, bad_request, not_found
from routing.proxy.nesting import check_nesting
from routing.proxy.pipeline.context import Receive, RequestContext, Scope, header
from routing.proxy.services import Services

SUPPORTED_ENDPOINTS = (
    "POST /v1/chat/completions, POST /v1/completions, POST /v1/embeddings (embedding models only), "
    "GET /v1/models and GET /v1/models/{model}"
)
# vLLM's server accepts only this media type on its JSON endpoints (validate_json_request).
JSON_MEDIA_TYPE = "application/json"
# Message roles that may carry `"content": null`, as in vLLM's (and OpenAI's) message types.
NULL_CONTENT_ROLES = ("assistant", "function")


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


# Known OpenAI fields and the checks they must pass; anything else is passed through to the engine.
def validate_common(body: dict[str, Any], kind: str) -> None:
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
        if value is not None and (not is_int(value) or value < 1):
            raise bad_request(f"'{name}' must be a positive integer.", param=name)
    n = body.get("n")
    if n is not None and (not is_int(n) or not 1 <= n <= 128):
        raise bad_request("'n' must be an integer from 1 to 128.", param="n")
    for name, low, high in (
        ("temperature", 0.0, 2.0),
        ("top_p", 0.0, 1.0),
        ("presence_penalty", -2.0, 2.0),
        ("frequency_penalty", -2.0, 2.0),
    ):
        value = body.get(name)
        if value is not None and (not is_number(value) or not low <= value <= high):
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


def check_json_media_type(content_type: str | None) -> None:
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


async def read_body(scope: Scope, receive: Receive, max_body: int) -> bytes:
    length = header(scope, b"content-length")
    if length is not None and length.isdigit() and int(length) > max_body:
        raise ProxyError(413, f"Request body is larger than {max_body} bytes.", code="body_too_large")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ProxyError(499, "Client disconnected.", code="client_disconnected")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_body:
            raise ProxyError(413, f"Request body is larger than {max_body} bytes.", code="body_too_large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def step(ctx: RequestContext, svc: Services) -> None:
    scope, info = ctx.scope, ctx.key
    assert scope is not None and info is not None and ctx.receive is not None
    content_type = header(scope, b"content-type")
    if content_type != JSON_MEDIA_TYPE:
        check_json_media_type(content_type)
    raw = await read_body(scope, ctx.receive, svc.max_body)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise bad_request("We could not parse the JSON body of your request.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_json")
    check_nesting(raw, body)
    validate_common(body, ctx.kind)
    ctx.body = body
    alias: str = body["model"]
    ctx.alias = alias
    ctx.stream = bool(body.get("stream"))
    if alias not in svc.snapshot.aliases:
        raise not_found(f"The model '{alias}' does not exist.{info.scope_note()}", param="model")
    if not info.may_use(alias):
        raise ProxyError(
            403,
            f"This API key may not use the model '{alias}'.{info.scope_note()}",
            type="permission_error",
            param="model",
            code="model_not_allowed",
        )
    priority = (header(scope, b"x-priority") or Priority.INTERACTIVE).lower()
    if priority not in (Priority.INTERACTIVE, Priority.BATCH):
        raise bad_request("Header x-priority must be 'interactive' or 'batch'.", param="x-priority")
    ctx.priority = priority

    # Output cap: the tighter of the key's limit and the request's own.
    max_out_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
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
    ctx.max_out_field = max_out_field
    ctx.requested_out = requested_out
