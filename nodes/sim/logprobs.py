"""Log-probabilities in vLLM's response shapes, from the simulated model (nodes/sim/model.py).

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

from nodes.sim import model
from nodes.sim.engine import Sequence
from nodes.sim.text import VOCAB, PromptTokenizer


def whole_vocab(k: int) -> int:
    """-1 asks for the whole vocabulary: the simulated model's is VOCAB (every other id has no mass)."""
    return len(VOCAB) if k == -1 else k


def token_name(idx: int, as_ids: bool) -> str:
    """A vocabulary entry as logprobs name it; with return_tokens_as_token_ids, "token_id:N"."""
    return f"token_id:{model.token_id(idx)}" if as_ids else VOCAB[idx]


def _step(dist: model.Distribution, chosen: int, k: int) -> list[tuple[int, float]]:
    """vLLM's per-position dict as (vocab index, logprob) pairs: the sampled token, then the top-k."""
    out = [(chosen, dist.logprob(chosen))]
    for idx, lp in dist.top(k):
        if idx != chosen:
            out.append((idx, lp))
    return out


def chat_logprobs(seq: Sequence, start: int, end: int, k: int, as_ids: bool = False) -> dict[str, Any]:
    k = whole_vocab(k)
    content = []
    for pos in range(start, end):
        tok = seq.out[pos]
        dist = model.distribution(seq.out_contexts[pos], seq.drift)
        step = _step(dist, tok, k)
        piece = token_name(tok, as_ids)
        content.append(
            {
                "token": piece,
                "logprob": step[0][1],
                "bytes": list(piece.encode()),
                "top_logprobs": [
                    {
                        "token": token_name(a, as_ids),
                        "logprob": lp,
                        "bytes": list(token_name(a, as_ids).encode()),
                    }
                    for a, lp in step[:k]
                ],
            }
        )
    return {"content": content}


def completion_logprobs(
    seq: Sequence, start: int, end: int, k: int, offset: int, as_ids: bool = False
) -> dict[str, Any]:
    k = whole_vocab(k)
    tokens, lps, tops, offsets = [], [], [], []
    for pos in range(start, end):
        tok = seq.out[pos]
        step = _step(model.distribution(seq.out_contexts[pos], seq.drift), tok, k)
        tokens.append(token_name(tok, as_ids))
        lps.append(step[0][1])
        tops.append({token_name(a, as_ids): lp for a, lp in step[: k + 1]})
        offsets.append(offset)
        offset += len(VOCAB[tok])
    return {"text_offset": offsets, "token_logprobs": lps, "tokens": tokens, "top_logprobs": tops}


def prompt_logprobs(
    ids: list[int], k: int, drift: float, tokenizer: PromptTokenizer
) -> list[dict[str, dict[str, Any]] | None]:
    """The model's view of a prompt, token by token (teacher forcing): what a drifted twin thinks of the
    reference's text is read here."""
    k = whole_vocab(k)
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
        out.append(entry)
    return out
