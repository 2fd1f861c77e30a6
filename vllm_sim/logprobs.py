"""Log-probabilities in vLLM's response shapes, from the simulated model (vllm_sim/model.py).

- chat `logprobs.content[i]`: {"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]};
  vLLM builds each position's list from a dict holding the sampled token first and then the top-k by
  rank (a token already present keeps its place), and returns its first k entries;
- completions `logprobs`: {"text_offset", "token_logprobs", "tokens", "top_logprobs": [{token: logprob}]},
  the same dict cut to its first k + 1 entries;
- `prompt_logprobs` (both endpoints): one entry per prompt token, None for the first (nothing precedes it),
  else {"<token id>": {"logprob", "rank", "decoded_token"}} with the prompt's own token first and then
  the top-k by rank (so k or k + 1 entries).
"""

from __future__ import annotations

from typing import Any

from vllm_sim import model
from vllm_sim.engine import Sequence
from vllm_sim.text import VOCAB, VOCAB_SIZE, PromptTokenizer

_REST: dict[tuple[int, bool, int], list[tuple[int, str]]] = {}


def whole_vocab(k: int) -> int:
    """-1 asks for the whole vocabulary; its output pieces come first (the rest: rest_of_vocab)."""
    return len(VOCAB) if k == -1 else k


def rest_of_vocab(
    tokenizer: PromptTokenizer | None, as_ids: bool, vocab: int = VOCAB_SIZE
) -> list[tuple[int, str]]:
    """(token id, name) of every id of the served model's vocabulary (`vocab` ids; by default Llama-3's
    128256) that is not an output piece: with -1, vLLM lists the whole vocabulary, and these ids have
    log-probability model.OOV_LOGPROB. Decoded once per process, tokenizer and size."""
    key = (id(tokenizer), as_ids, vocab)
    if key not in _REST:
        out_ids = {model.token_id(i) for i in range(len(VOCAB))}
        _REST[key] = [
            (t, f"token_id:{t}" if as_ids else (tokenizer.decode([t]) if tokenizer is not None else ""))
            for t in range(vocab)
            if t not in out_ids
        ]
    return _REST[key]


def token_name(idx: int, as_ids: bool) -> str:
    """A vocabulary entry as logprobs name it; with return_tokens_as_token_ids, "token_id:N"."""
    return f"token_id:{model.token_id(idx)}" if as_ids else model.piece(idx)


def _step(
    dist: model.Distribution,
    chosen: int,
    k: int,
    as_ids: bool,
    ids: list[int] | None = None,
    tokenizer: PromptTokenizer | None = None,
) -> list[tuple[str, float]]:
    """vLLM's per-position dict as (token name, logprob) pairs: the sampled token, then the top-k; with
    `logprob_token_ids`, the sampled token and then exactly those ids in their order (the sampler gathers
    [sampled, *ids], v1/sample/sampler.py:152-225; a repeated id keeps its first place)."""
    out = [(token_name(chosen, as_ids), dist.logprob(chosen))]
    if ids:
        seen = {model.token_id(chosen)}
        for tid in ids:
            if tid in seen:
                continue
            seen.add(tid)
            idx = model.vocab_index(tid)
            if as_ids:
                name = f"token_id:{tid}"
            elif idx is not None:
                name = VOCAB[idx]
            else:
                name = tokenizer.decode([tid]) if tokenizer is not None else ""
            out.append((name, dist.logprob(idx)))
        return out
    for idx, lp in dist.top(k):
        if idx != chosen:
            out.append((token_name(idx, as_ids), lp))
    return out


def chat_logprobs(
    seq: Sequence,
    start: int,
    end: int,
    k: int,
    as_ids: bool = False,
    ids: list[int] | None = None,
    tokenizer: PromptTokenizer | None = None,
    vocab: int = VOCAB_SIZE,
) -> dict[str, Any]:
    whole = k == -1
    k = whole_vocab(k)
    content = []
    for pos in range(start, end):
        tok = seq.out[pos]
        dist = model.distribution(seq.out_contexts[pos], seq.drift)
        step = _step(dist, tok, k, as_ids, ids, tokenizer)
        piece = step[0][0]
        # _get_top_logprobs (chat_completion/serving.py:1187-1212): the first k entries, or all of them
        # with logprob_token_ids (return_all) or top_logprobs -1 (the whole vocabulary).
        listed = step if ids else step[:k]
        if whole and not ids:
            listed = step + [(name, model.OOV_LOGPROB) for _, name in rest_of_vocab(tokenizer, as_ids, vocab)]
        content.append(
            {
                "token": piece,
                "logprob": step[0][1],
                "bytes": list(piece.encode()),
                "top_logprobs": [
                    {"token": name, "logprob": lp, "bytes": list(name.encode())} for name, lp in listed
                ],
            }
        )
    return {"content": content}


def completion_logprobs(
    seq: Sequence,
    start: int,
    end: int,
    k: int,
    offset: int,
    as_ids: bool = False,
    ids: list[int] | None = None,
    tokenizer: PromptTokenizer | None = None,
) -> dict[str, Any]:
    # completion/serving.py:703-719 lists entry i when `logprobs >= i`: with logprobs -1, none.
    whole = k == -1
    k = whole_vocab(k)
    tokens, lps, tops, offsets = [], [], [], []
    for pos in range(start, end):
        tok = seq.out[pos]
        step = _step(model.distribution(seq.out_contexts[pos], seq.drift), tok, k, as_ids, ids, tokenizer)
        tokens.append(step[0][0])
        lps.append(step[0][1])
        listed = step if ids else step[: k + 1]
        tops.append({} if whole and not ids else dict(listed))
        offsets.append(offset)
        offset += len(model.piece(tok))
    return {"text_offset": offsets, "token_logprobs": lps, "tokens": tokens, "top_logprobs": tops}


def prompt_logprobs(
    ids: list[int], k: int, drift: float, tokenizer: PromptTokenizer, vocab: int = VOCAB_SIZE
) -> list[dict[str, dict[str, Any]] | None]:
    """The model's view of a prompt, token by token (teacher forcing): what a drifted twin thinks of the
    reference's text is read here."""
    whole = k == -1
    k = whole_vocab(k)
    rest = rest_of_vocab(tokenizer, False, vocab) if whole else []
    out: list[dict[str, dict[str, Any]] | None] = []
    for i, h in enumerate(model.contexts(ids)):
        if i == 0:
            out.append(None)
            continue
        dist = model.distribution(h, drift)
        actual = ids[i]
        vidx = model.vocab_index(actual)
        entry: dict[str, dict[str, Any]] = {
            str(actual): {
                "logprob": dist.logprob(vidx),
                "rank": dist.rank(vidx),
                "decoded_token": VOCAB[vidx] if vidx is not None else tokenizer.decode([actual]),
            }
        }
        for rank, (idx, lp) in enumerate(dist.top(k), start=1):
            key = str(model.token_id(idx))
            if key not in entry:
                entry[key] = {"logprob": lp, "rank": rank, "decoded_token": VOCAB[idx]}
        for rank, (tid, name) in enumerate(rest, start=len(VOCAB) + 1):
            if str(tid) not in entry:
                entry[str(tid)] = {"logprob": model.OOV_LOGPROB, "rank": rank, "decoded_token": name}
        out.append(entry)
    return out
