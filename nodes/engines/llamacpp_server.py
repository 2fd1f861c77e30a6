"""The llama.cpp engine process: llama-cpp-python's OpenAI server, unchanged, plus one route of ours.

`python -m nodes.engines.llamacpp_server <llama_cpp.server's flags>` runs `llama_cpp.server`'s own
main() (same flags, same environment, same OpenAI routes, same key) on an app that also serves

    POST /inferchain/v1/token_logprobs

the model's next-token log-probabilities at each position of a text or a list of token ids, keyed by
token id. The evaluation runner teacher-forces llama.cpp engines with it: llama-cpp-python's own
listings (`echo: true, logprobs: k`) are keyed by each token's text decoded alone with
errors="ignore", so the special tokens (end of turn among them) all decode to "" and byte pieces
collide, and their probability is lost (docs/evaluations.md, "Exact or top-k").

Request (JSON): `prompt` (text, tokenized as /v1/completions tokenizes a text prompt: the model's BOS
if it adds one, special tokens parsed) or `prompt_token_ids` (used as given); `last` (optional): only
the distributions predicting the last n tokens (default: every token but the first); `top_k`: how many
tokens each position lists, the most likely first (-1, or at least the vocabulary size: every token);
`model` (optional, as in /v1/completions).

Response: `token_ids` (the whole sequence), `vocab_size`, `whole_vocabulary`, and `positions`, one per
scored token i: `index` i, `token_id`, `token` (its text as llama-cpp-python's listings write it, so a
caller can line positions up with a chat response's tokens), `logprob` (of token i), `top_logprobs`
({token id: logprob}, the top k plus token i itself) and `tail_mass` (1 - the listed probability; 0
for the whole vocabulary). Each distribution is log_softmax(logits) of the row that predicts token i,
at temperature 1, in float64: no sampler, penalty or bias is applied.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from llama_cpp.server.app import authenticate, create_app, get_llama_proxy
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

ROUTE = "/inferchain/v1/token_logprobs"


class TokenLogprobsError(ValueError):
    """A request this route cannot answer (HTTP 400)."""


def log_softmax(rows: np.ndarray) -> np.ndarray:
    """Natural-log softmax of each row, in float64 (temperature 1)."""
    rows = np.asarray(rows, dtype=np.float64)
    top = rows.max(axis=1, keepdims=True)
    return rows - (top + np.log(np.exp(rows - top).sum(axis=1, keepdims=True)))


def token_logprobs(
    llama: Any,
    *,
    prompt: str | None = None,
    prompt_token_ids: Sequence[int] | None = None,
    last: int | None = None,
    top_k: int = 20,
) -> dict[str, Any]:
    """The route's answer for one loaded `llama_cpp.Llama` (the caller holds the model's lock)."""
    if (prompt is None) == (prompt_token_ids is None):
        raise TokenLogprobsError("give exactly one of prompt and prompt_token_ids")
    if not getattr(llama, "_logits_all", True):
        raise TokenLogprobsError("the engine runs with --logits_all false: it keeps no per-position logits")
    vocab = int(llama.n_vocab())
    if prompt_token_ids is not None:
        ids = [int(t) for t in prompt_token_ids]
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise TokenLogprobsError(f"token ids outside the vocabulary (0..{vocab - 1}): {bad[:5]}")
    else:
        assert prompt is not None
        ids = list(llama.tokenize(prompt.encode("utf-8"), add_bos=True, special=True))
    n = len(ids)
    if n < 2:
        raise TokenLogprobsError("the sequence needs at least two tokens (one to predict from)")
    if n >= int(llama.n_ctx()):
        raise TokenLogprobsError(f"{n} tokens do not fit the context window ({llama.n_ctx()})")
    first = 1 if last is None else max(1, n - int(last))
    # A fresh evaluation of the whole sequence (no cached prefix whose rows might be stale): row j of the
    # logits predicts token j + 1.
    llama.reset()
    llama.eval(ids)
    rows = log_softmax(np.asarray(llama.scores[first - 1 : n - 1]))
    whole = top_k < 0 or top_k >= vocab
    k = vocab if whole else max(0, top_k)
    all_ids = [str(t) for t in range(vocab)] if whole else []
    positions = []
    for j, i in enumerate(range(first, n)):
        row = rows[j]
        tok = ids[i]
        if whole:
            listed = dict(zip(all_ids, row.tolist(), strict=True))
            tail = 0.0
        else:
            top = np.argpartition(-row, k - 1)[:k] if k else np.empty(0, dtype=np.int64)
            top = top[np.argsort(-row[top], kind="stable")]
            listed = {str(int(t)): float(row[t]) for t in top}
            listed.setdefault(str(tok), float(row[tok]))
            tail = max(0.0, 1.0 - float(np.exp(np.fromiter(listed.values(), dtype=np.float64)).sum()))
        positions.append(
            {
                "index": i,
                "token_id": tok,
                "token": llama.detokenize([tok]).decode("utf-8", errors="ignore"),
                "logprob": float(row[tok]),
                "top_logprobs": listed,
                "tail_mass": tail,
            }
        )
    return {
        "object": "token_logprobs",
        "vocab_size": vocab,
        "whole_vocabulary": whole,
        "token_ids": ids,
        "positions": positions,
    }


class TokenLogprobsRequest(BaseModel):
    model: str | None = None
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    last: int | None = Field(default=None, ge=1)
    top_k: int = 20


router = APIRouter()


@router.post(
    ROUTE,
    dependencies=[Depends(authenticate)],
    summary="Next-token log-probabilities by token id (inferchain)",
    response_model=None,
)
async def create_token_logprobs(
    body: TokenLogprobsRequest, llama_proxy: Annotated[Any, Depends(get_llama_proxy)]
) -> Response:
    """The route, on llama_cpp.server's own model lock (get_llama_proxy) and key check (authenticate)."""
    if llama_proxy is None:
        return JSONResponse({"error": {"message": "no model is loaded"}}, status_code=503)
    llama = llama_proxy(body.model)

    def answer() -> str:
        return json.dumps(
            token_logprobs(
                llama,
                prompt=body.prompt,
                prompt_token_ids=body.prompt_token_ids,
                last=body.last,
                top_k=body.top_k,
            )
        )

    try:
        text = await run_in_threadpool(answer)
    except TokenLogprobsError as exc:
        return JSONResponse(
            {"error": {"message": str(exc), "type": "invalid_request_error"}}, status_code=400
        )
    return Response(text, media_type="application/json")


def main() -> None:
    import llama_cpp.server.__main__ as server_main

    def create_app_with_route(*args: Any, **kwargs: Any) -> Any:
        app = create_app(*args, **kwargs)
        app.include_router(router)
        return app

    # llama_cpp.server's main() builds its app with the module-level name create_app: the same app,
    # flags and settings, with our route added.
    server_main.create_app = create_app_with_route
    server_main.main()


if __name__ == "__main__":
    main()
