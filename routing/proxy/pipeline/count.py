"""Step 3, count: the prompt's tokens (the model's own tokenizer, or the simulator's rule) and the key's
input cap. Synchronous: a tokenizer not loaded yet is loaded (off the loop) before it runs."""

from __future__ import annotations

from routing.proxy.errors import bad_request
from routing.proxy.pipeline.context import RequestContext
from routing.proxy.pipeline.read import is_int, unsupported_endpoint
from routing.proxy.services import Services
from routing.proxy.tokens import chat_roles, count_prompt_tokens, count_sim_rule, prompt_text_parts


def tokenizer_to_load(ctx: RequestContext, svc: Services) -> str | None:
    """The path of the alias's tokenizer when it is not loaded yet (the pipeline awaits its loading)."""
    model_info = svc.snapshot.models.get(ctx.alias)
    if model_info is None or model_info.sim_tokens or not model_info.tokenizer_path:
        return None
    path = model_info.tokenizer_path
    return None if path in svc.tokenizers.loaded else path


def step(ctx: RequestContext, svc: Services) -> None:
    info, body, alias = ctx.key, ctx.body, ctx.alias
    assert info is not None and body is not None
    if ctx.kind == "embedding" and alias in svc.snapshot.no_embeddings:
        raise unsupported_endpoint("POST", "/v1/embeddings", alias)
    parts = prompt_text_parts(body, ctx.kind)
    model_info = svc.snapshot.models.get(alias)
    if model_info is not None and model_info.sim_tokens:
        counted = count_sim_rule(body, ctx.kind)
    else:
        tokenizer = None
        if model_info is not None and model_info.tokenizer_path:
            tokenizer = svc.tokenizers.loaded[model_info.tokenizer_path]
        counted = count_prompt_tokens(parts, tokenizer, chat_roles(body) if ctx.kind == "chat" else None)
    prompt = body.get("prompt")
    if ctx.kind == "completion" and isinstance(prompt, list) and all(is_int(t) for t in prompt):
        # A token-id prompt counts itself exactly.
        counted = type(counted)(tokens=len(prompt), estimated=False, leading_ids=prompt)
        ctx.token_prompt = True
    ctx.parts = parts
    ctx.counted = counted
    ctx.prompt_tokens = counted.tokens
    ctx.prompt_estimated = counted.estimated
    if info.log_prompts:
        ctx.prompt_text = "\n".join(parts)[:100_000]
    max_in = info.max_input_tokens()
    if max_in is not None and counted.tokens > max_in:
        raise bad_request(
            f"The prompt has {counted.tokens} tokens, above this key's limit of {max_in} input tokens.",
            param="messages" if ctx.kind == "chat" else "prompt",
            code="input_tokens_exceeded",
        )
