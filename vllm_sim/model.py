"""The simulated language model: a deterministic next-token distribution per context, and a drifted twin.

The distribution of the next token depends on a 64-bit hash of *every token id before it* (the context
hash, chained one token at a time), never on how that text came to be. So scoring a text as a prompt
(`prompt_logprobs`) sees exactly the distributions that generating it saw: the reference scoring its own
output agrees with itself at every position, and a drifted candidate scoring the reference's output
(teacher forcing) disagrees in a known way. docs/simulator.md ("The simulated model") gives the numbers.

At a context hash h, over the output vocabulary (text.VOCAB, V pieces, ids VOCAB_ID_BASE + index):

- HEAD tokens have their own probability: rank 1 (the greedy token) gets c = 0.40 + 0.55·u (u uniform
  from h), ranks 2..HEAD share 0.9·(1 - c) geometrically (ratio 0.6); every other vocabulary token gets an
  equal share of the remaining 0.1·(1 - c). Any token id outside the output vocabulary (prompt text the
  model would never write) has log-probability OOV_LOGPROB.
- End of sequence: after a token, the model stops if its new context hash draws below 1/mean.

`--sim-quality-drift F` (the candidate) changes two things, both decided by h, so reproducibly:

1. **swap**: at a fraction F of contexts (a draw from h below F), the probabilities of ranks 1 and 2 are
   exchanged: the candidate's top-1 differs from the reference's there, so teacher-forced top-1
   agreement is 1 - F and greedy outputs part at the first such context (position ~ geometric(F));
2. **noise**: the log-probabilities of ranks 2..HEAD move by up to ±0.2·F (renormalised, their total
   kept), a small KL everywhere that never changes the top-1.

KL(reference || candidate) at a swapped context is (p1 - p2)·ln(p1/p2) plus the small noise term.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from vllm_sim import text
from vllm_sim.text import MASK64, VOCAB, mix64

V = len(VOCAB)
VOCAB_ID_BASE = 100  # text.VOCAB_IDS: piece i has token id 100 + i
HEAD = 20  # tokens with a probability of their own (vLLM's default --max-logprobs is 20)
HEAD_RATIO = 0.6
HEAD_SHARE = 0.9  # of the mass rank 1 leaves, the part ranks 2..HEAD share
MIN_TOP1, TOP1_SPAN = 0.40, 0.55
NOISE = 0.2  # log-probability noise amplitude per unit of drift
OOV_LOGPROB = -30.0
# A generated token outside the output pieces (one that allowed_token_ids or a positive logit_bias forced)
# is held in a sequence as FOREIGN + its token id; the model gives it OOV_LOGPROB like any other such id.
FOREIGN = 1 << 24

_CTX_SEED = 0x243F6A8885A308D3
_CTX_MULT = 0x9E3779B97F4A7C15
_CONF_SALT = 0x13198A2E03707344
_SWAP_SALT = 0x5DEECE66D
_NOISE_SALT = 0xA4093822299F31D0
_EOS_SALT = 0x2545F4914F6CDD1D
_HEAD_WEIGHTS = [HEAD_RATIO**j for j in range(HEAD - 1)]
_HEAD_WEIGHT_SUM = sum(_HEAD_WEIGHTS)
_TWO64 = float(1 << 64)


def _unit(x: int) -> float:
    """A 64-bit hash as a uniform number in [0, 1)."""
    return (x >> 11) / 9007199254740992.0


def extend_context(h: int, token_id: int) -> int:
    """The context hash after one more token."""
    return mix64(h ^ ((token_id * _CTX_MULT) & MASK64))


def context_hash(token_ids: list[int], h: int = _CTX_SEED) -> int:
    """The context hash after these tokens (from the empty context unless h is given)."""
    for t in token_ids:
        h = mix64(h ^ ((t * _CTX_MULT) & MASK64))
    return h


def contexts(token_ids: list[int]) -> Iterator[int]:
    """The context hash before each token of the list (position i sees token_ids[:i])."""
    h = _CTX_SEED
    for t in token_ids:
        yield h
        h = mix64(h ^ ((t * _CTX_MULT) & MASK64))


def head_indices(h: int, n: int = HEAD) -> list[int]:
    """Vocabulary indices of the reference ranks 1..n at context h (distinct)."""
    out: list[int] = []
    j = 1
    while len(out) < n:
        idx = mix64(h + j) % V
        if idx not in out:
            out.append(idx)
        j += 1
    return out


def top1_probability(h: int) -> float:
    return MIN_TOP1 + TOP1_SPAN * _unit(mix64(h ^ _CONF_SALT))


def swapped(h: int, drift: float) -> bool:
    """Whether the drifted model exchanges ranks 1 and 2 at this context."""
    return drift > 0.0 and _unit(mix64(h ^ _SWAP_SALT)) < drift


def ends_here(h: int, mean_tokens: int) -> bool:
    """End of sequence after the token that led to context h (probability 1/mean per token)."""
    return _unit(mix64(h ^ _EOS_SALT)) * max(1, mean_tokens) < 1.0


@dataclass(frozen=True)
class Distribution:
    """The next-token distribution at one context: the head best first, one probability for the rest."""

    head: tuple[tuple[int, float], ...]  # (vocab index, log-probability), most likely first
    tail_logprob: float  # every output-vocabulary token not in the head

    def logprob(self, vocab_index: int | None) -> float:
        if vocab_index is None or vocab_index >= V:
            return OOV_LOGPROB
        for idx, lp in self.head:
            if idx == vocab_index:
                return lp
        return self.tail_logprob

    def rank(self, vocab_index: int | None) -> int:
        """1-based rank as vLLM reports it: 1 + the number of tokens strictly more likely."""
        if vocab_index is None or vocab_index >= V:
            return V + 1
        for r, (idx, _) in enumerate(self.head, start=1):
            if idx == vocab_index:
                return r
        return len(self.head) + 1

    def top(self, k: int) -> list[tuple[int, float]]:
        """The k most likely (vocab index, log-probability); beyond the head, tail tokens in vocab order."""
        out = list(self.head[:k])
        if k > len(out):
            listed = {idx for idx, _ in self.head}
            for idx in range(V):
                if len(out) >= k:
                    break
                if idx not in listed:
                    out.append((idx, self.tail_logprob))
        return out


def distribution(h: int, drift: float = 0.0) -> Distribution:
    """The model's next-token distribution at context hash h; drift > 0 gives the drifted twin's."""
    c = top1_probability(h)
    rest = (1.0 - c) * HEAD_SHARE
    idx = head_indices(h)
    probs = [c] + [rest * w / _HEAD_WEIGHT_SUM for w in _HEAD_WEIGHTS]
    if drift > 0.0:
        amp = NOISE * drift
        noisy = [
            p * math.exp(amp * (2.0 * _unit(mix64((h ^ _NOISE_SALT) + j)) - 1.0))
            for j, p in enumerate(probs[1:], start=1)
        ]
        scale = rest / sum(noisy)
        probs[1:] = [p * scale for p in noisy]
        if swapped(h, drift):
            probs[0], probs[1] = probs[1], probs[0]
    tail = (1.0 - c) * (1.0 - HEAD_SHARE) / (V - HEAD)
    head = sorted(zip(idx, (math.log(p) for p in probs), strict=True), key=lambda t: -t[1])
    return Distribution(head=tuple(head), tail_logprob=math.log(tail))


def greedy_token(h: int, drift: float = 0.0) -> int:
    """The most likely next token (vocab index) at context h: rank 1, or rank 2 where the twin swaps."""
    first = mix64(h + 1) % V
    if not swapped(h, drift):
        return first
    j = 2
    while True:
        idx = mix64(h + j) % V
        if idx != first:
            return idx
        j += 1


def sample_token(h: int, drift: float, u: float) -> int:
    """A token drawn with the uniform u from the model's distribution at h (the twin's swap applied;
    the small noise of a drifted twin is left out of sampling)."""
    c = top1_probability(h)
    if u < c:
        return greedy_token(h, drift)
    u = (u - c) / (1.0 - c)
    if u < HEAD_SHARE:
        # Rank 2..HEAD by the inverse of the truncated geometric weights.
        target = u / HEAD_SHARE * _HEAD_WEIGHT_SUM
        acc = 0.0
        rank = HEAD
        for j, w in enumerate(_HEAD_WEIGHTS, start=2):
            acc += w
            if target < acc:
                rank = j
                break
        idx = head_indices(h, rank)
        if rank == 2 and swapped(h, drift):
            return idx[0]
        return idx[rank - 1]
    # The tail: a uniform pick among the vocabulary tokens outside the head.
    head = set(head_indices(h))
    outside = [i for i in range(V) if i not in head]
    return outside[int((u - HEAD_SHARE) / (1.0 - HEAD_SHARE) * len(outside)) % len(outside)]


def constrained_token(
    h: int,
    drift: float,
    greedy: bool,
    u: float,
    bias: dict[int, float] | None,
    allowed: frozenset[int] | None,
) -> int:
    """The next token when the request sets `logit_bias` and/or `allowed_token_ids` (vocab indices): the
    biases are added to the model's log-probabilities and every token outside `allowed` is masked, as
    vLLM's logits processors do before sampling; greedy takes the best, otherwise a draw with u.
    The log-probabilities a response reports stay the raw ones (vLLM's default logprobs_mode
    "raw_logprobs", config/model.py:255)."""
    dist = distribution(h, drift)
    # Tokens outside the output pieces (FOREIGN + id) compete too when named: at OOV_LOGPROB they win
    # only as the allowed ones or with a large enough bias, as such a token would in vLLM.
    foreign = sorted(i for i in bias if i >= FOREIGN) if bias and not allowed else []
    candidates: Sequence[int] = [*range(V), *foreign] if not allowed else sorted(allowed)
    scores = [(idx, dist.logprob(idx) + (bias.get(idx, 0.0) if bias else 0.0)) for idx in candidates]
    if greedy:
        return max(scores, key=lambda t: t[1])[0]
    top = max(lp for _, lp in scores)
    weights = [math.exp(lp - top) for _, lp in scores]
    target = u * sum(weights)
    acc = 0.0
    for (idx, _), w in zip(scores, weights, strict=True):
        acc += w
        if target < acc:
            return idx
    return scores[-1][0]


def vocab_index(token_id: int) -> int | None:
    """The output-vocabulary index of a token id, or None for a token the model never writes."""
    idx = token_id - VOCAB_ID_BASE
    return idx if 0 <= idx < V else None


def token_id(vocab_idx: int) -> int:
    """The token id of a generated token: an output piece's, or a forced foreign token's own."""
    return vocab_idx - FOREIGN if vocab_idx >= FOREIGN else VOCAB_ID_BASE + vocab_idx


def generated_index(token_id: int) -> int:
    """How a sequence holds a token id it is made to generate: its output-piece index, else FOREIGN + id."""
    idx = vocab_index(token_id)
    return FOREIGN + token_id if idx is None else idx


def piece(tok: int, decode: Callable[[list[int]], str] = text.detokenize) -> str:
    """The text of a generated token: its output piece, or a foreign token decoded by `decode` (the
    served tokenizer where the caller has it; the built-in one knows the ids it has seen)."""
    return VOCAB[tok] if tok < V else decode([token_id(tok)])


def sampling_uniform(key: int, position: int) -> float:
    """The sampler's uniform draw for one position of one request (its key carries prompt and seed)."""
    return _unit(mix64(key + position * 0x632BE59BD9B4E019))


def expected_swap_kl(drift: float, samples: int = 2000) -> float:
    """The mean KL(reference || drifted twin) over many contexts, for documentation and tests' ballparks."""
    total = 0.0
    for i in range(samples):
        h = mix64(i + 12345)
        ref = dict(distribution(h).head)
        cand = dict(distribution(h, drift).head)
        total += sum(math.exp(lp) * (lp - cand[idx]) for idx, lp in ref.items())
    return total / samples
