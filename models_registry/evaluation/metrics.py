"""Evaluation metrics: plain functions over the two outputs (reference, candidate) of one prompt, and a run.

Every definition is written out, with worked examples, in docs/evaluations.md; the tests check each one on
hand-computed values. Nothing here touches Django or the network, so scoring a sample costs only the
arithmetic (benchmarks/eval_scoring.py measures it).

Conventions: "reference" is the full-precision side, "candidate" the quantized one; differences are
candidate minus reference; logarithms are natural (KL in nats).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from statistics import NormalDist
from typing import Any

from sacrebleu.metrics import CHRF

from models_registry.evaluation.rules import answer_matches

# A token of a distribution: its text (chat logprobs) or its id (prompt_logprobs), as the engine gives it
# (any hashable value; Any because Mapping is invariant in its key type).
Token = Any
# One position's distribution as an engine lists it: token -> log-probability (natural log), top-k only.
TopK = Mapping[Token, float]

# -- comparing two outputs -------------------------------------------------------------------------------


def exact_match(reference: str, candidate: str) -> bool:
    """The two outputs are the same text, character for character (no normalisation)."""
    return reference == candidate


def first_divergence(reference: Sequence[Any], candidate: Sequence[Any]) -> int | None:
    """Index of the first position where the two token sequences differ; None when they are equal.

    When one is a prefix of the other they part where the shorter one ends (its length).
    """
    for i, (a, b) in enumerate(zip(reference, candidate, strict=False)):
        if a != b:
            return i
    if len(reference) == len(candidate):
        return None
    return min(len(reference), len(candidate))


def token_agreement(reference: Sequence[Any], candidate: Sequence[Any]) -> float:
    """Share of positions holding the same token, over the longer sequence's length (1.0 if both empty).

    Positions are compared index by index, so a token inserted early shifts everything after it and counts
    as disagreement there too: this measures "same tokens in the same places".
    """
    longest = max(len(reference), len(candidate))
    if longest == 0:
        return 1.0
    same = sum(1 for a, b in zip(reference, candidate, strict=False) if a == b)
    return same / longest


_CHRF = CHRF()  # sacrebleu defaults: character n-grams up to 6, no word n-grams, beta 2 (chrF, not chrF++)


def chrf(reference: str, candidate: str) -> float:
    """sacrebleu's sentence chrF of the candidate against the reference output, 0..100.

    Two empty outputs are identical and score 100 (sacrebleu alone would say 0).
    """
    if not reference and not candidate:
        return 100.0
    return float(_CHRF.sentence_score(candidate, [reference]).score)


def length_difference(reference: Sequence[Any] | int, candidate: Sequence[Any] | int) -> int:
    """Candidate length minus reference length (in tokens when given token lists or token counts)."""
    ref = reference if isinstance(reference, int) else len(reference)
    cand = candidate if isinstance(candidate, int) else len(candidate)
    return cand - ref


# -- accuracy and flips -----------------------------------------------------------------------------------


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion (no continuity correction); (0, 1) when n is 0."""
    if n == 0:
        return (0.0, 1.0)
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def paired_difference_ci(
    both_right: int, wrong_to_right: int, right_to_wrong: int, both_wrong: int, confidence: float = 0.95
) -> tuple[float, float]:
    """Confidence interval of candidate accuracy minus reference accuracy on the same cases.

    Newcombe's hybrid score interval for paired proportions (Newcombe 1998, method 10): Wilson intervals
    of the two accuracies combined with the phi correlation of the paired table (continuity-adjusted as
    in that paper). It stays inside [-1, 1] and is sensible at 0 or 100% accuracy, where the Wald
    interval collapses. Cells: both right, wrong->right (only the candidate right), right->wrong (only the
    reference right), both wrong.
    """
    a, b, c, d = both_right, wrong_to_right, right_to_wrong, both_wrong
    n = a + b + c + d
    if n == 0:
        return (-1.0, 1.0)
    p1 = (a + b) / n  # candidate accuracy
    p2 = (a + c) / n  # reference accuracy
    l1, u1 = wilson_interval(a + b, n, confidence)
    l2, u2 = wilson_interval(a + c, n, confidence)
    marginals = (a + b) * (c + d) * (a + c) * (b + d)
    phi = 0.0
    if marginals > 0:
        cross = a * d - b * c
        adjusted = cross - n / 2 if cross > n / 2 else (cross if cross < 0 else 0.0)
        phi = adjusted / math.sqrt(marginals)
    diff = p1 - p2
    low = diff - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    high = diff + math.sqrt(max(0.0, (p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2))
    return (max(-1.0, low), min(1.0, high))


@dataclass(frozen=True)
class FlipTable:
    """The paired right/wrong table of a run's cases that have an expected answer."""

    both_right: int
    right_to_wrong: int  # the reference was right, the candidate wrong
    wrong_to_right: int  # the reference was wrong, the candidate right
    both_wrong: int
    confidence: float = 0.95

    @property
    def n(self) -> int:
        return self.both_right + self.right_to_wrong + self.wrong_to_right + self.both_wrong

    @property
    def reference_accuracy(self) -> float | None:
        return (self.both_right + self.right_to_wrong) / self.n if self.n else None

    @property
    def candidate_accuracy(self) -> float | None:
        return (self.both_right + self.wrong_to_right) / self.n if self.n else None

    @property
    def flips(self) -> int:
        return self.right_to_wrong + self.wrong_to_right

    @property
    def flip_rate(self) -> float | None:
        return self.flips / self.n if self.n else None

    @property
    def accuracy_difference(self) -> float | None:
        """Candidate accuracy minus reference accuracy: (wrong->right - right->wrong) / n."""
        return (self.wrong_to_right - self.right_to_wrong) / self.n if self.n else None

    @property
    def difference_ci(self) -> tuple[float, float] | None:
        if not self.n:
            return None
        return paired_difference_ci(
            self.both_right, self.wrong_to_right, self.right_to_wrong, self.both_wrong, self.confidence
        )

    def as_dict(self) -> dict[str, Any]:
        ci = self.difference_ci
        return {
            **asdict(self),
            "n": self.n,
            "reference_accuracy": self.reference_accuracy,
            "candidate_accuracy": self.candidate_accuracy,
            "flips": self.flips,
            "flip_rate": self.flip_rate,
            "accuracy_difference": self.accuracy_difference,
            "difference_ci": list(ci) if ci else None,
        }


def flip_table(pairs: Iterable[tuple[bool, bool]], confidence: float = 0.95) -> FlipTable:
    """Count (reference correct, candidate correct) pairs into the four cells."""
    cells = [0, 0, 0, 0]
    for ref_ok, cand_ok in pairs:
        cells[(0 if ref_ok else 2) + (0 if cand_ok else 1)] += 1
    # index: 0 both right, 1 right->wrong, 2 wrong->right, 3 both wrong
    return FlipTable(cells[0], cells[1], cells[2], cells[3], confidence)


# -- distributions: top-1 agreement and KL -----------------------------------------------------------------

KL_FLOOR = 1e-10  # smallest probability a token can have on the candidate side (keeps KL finite)


def _completed(listed: TopK, support: set[Token]) -> tuple[dict[Token, float], float]:
    """Probabilities over `support` plus a "rest" bucket, from a top-k listing.

    Listed tokens keep exp(logprob). The mass the listing leaves out, max(0, 1 - listed mass), is shared
    evenly by the support tokens this side did not list and the rest bucket (everything outside the
    support), one share each.
    """
    probs = {tok: math.exp(lp) for tok, lp in listed.items()}
    listed_mass = sum(probs.values())
    missing = [tok for tok in support if tok not in probs]
    residual = max(0.0, 1.0 - listed_mass)
    share = residual / (len(missing) + 1)
    for tok in missing:
        probs[tok] = share
    return probs, share


def kl_divergence(reference: TopK, candidate: TopK) -> float:
    """KL(reference || candidate) in nats at one position, from the two sides' top-k logprob listings.

    The support is the union of both listings plus one "rest" bucket; each side's unlisted mass is spread
    over what it did not list (see _completed). When both sides list their whole distribution this is
    the exact KL; with top-k listings it is the top-k approximation documented in docs/evaluations.md.
    Candidate probabilities are floored at KL_FLOOR.
    """
    support = set(reference) | set(candidate)
    p, p_rest = _completed(reference, support)
    q, q_rest = _completed(candidate, support)
    total = 0.0
    for tok, pt in p.items():
        if pt > 0.0:
            total += pt * (math.log(pt) - math.log(max(q[tok], KL_FLOOR)))
    if p_rest > 0.0:
        total += p_rest * (math.log(p_rest) - math.log(max(q_rest, KL_FLOOR)))
    return max(0.0, total)


def top1(listed: TopK) -> Token | None:
    """The most likely token of a listing (the first listed among equals); None for an empty listing."""
    best: Token | None = None
    best_lp = -math.inf
    for tok, lp in listed.items():
        if lp > best_lp:
            best, best_lp = tok, lp
    return best


def listing_from_chat(item: Mapping[str, Any]) -> dict[str, float]:
    """One position of a chat response's `logprobs.content`: its top_logprobs plus the token itself,
    keyed by token text."""
    out = {str(t["token"]): float(t["logprob"]) for t in item.get("top_logprobs") or []}
    out.setdefault(str(item["token"]), float(item["logprob"]))
    return out


def listing_from_completion(top: Mapping[str, float]) -> dict[str, float]:
    """One position of a completion response's `logprobs.top_logprobs` (already token text -> logprob)."""
    return {str(tok): float(lp) for tok, lp in top.items()}


def listing_from_prompt_logprobs(entry: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """One position of vLLM's `prompt_logprobs` ({token id: {logprob, rank, decoded_token}}), re-keyed by
    token text so it compares with the generation listings above."""
    return {str(v["decoded_token"]): float(v["logprob"]) for v in entry.values()}


class KLMode(StrEnum):
    """Where the two sides' distributions come from (docs/evaluations.md, "Distributions")."""

    # The candidate scored the reference's own output (prompt_logprobs): same text, every position.
    TEACHER_FORCED = "teacher_forced"
    # Each side's own generation top-k (top_logprobs), compared while both still had the same context.
    FREE_RUNNING_TOPK = "free_running_topk"


@dataclass
class DistributionComparison:
    """Top-1 agreement and KL of one sample's per-position distributions."""

    mode: str
    positions: int
    top1_agreements: int
    kl: list[float] = field(default_factory=list)

    @property
    def top1_agreement(self) -> float | None:
        return self.top1_agreements / self.positions if self.positions else None

    @property
    def mean_kl(self) -> float | None:
        return sum(self.kl) / len(self.kl) if self.kl else None

    @property
    def max_kl(self) -> float | None:
        return max(self.kl) if self.kl else None


def compare_distributions(
    reference: Sequence[TopK],
    candidate: Sequence[TopK],
    mode: str = KLMode.TEACHER_FORCED,
    *,
    divergence: int | None = None,
) -> DistributionComparison:
    """Per-position top-1 agreement and KL(reference || candidate).

    teacher_forced: both lists describe the same positions of the reference's text (the candidate's came
    from scoring that text), so they must be equally long; every position counts.

    free_running_topk: each list is a side's own generation; positions 0..divergence (the first
    divergence index, inclusive) are the ones where both sides had seen the same text, and only they
    count; with divergence None (identical outputs) all common positions count.
    """
    if mode == KLMode.TEACHER_FORCED:
        if len(reference) != len(candidate):
            raise ValueError(
                f"teacher-forced distributions cover the same positions: {len(reference)} != {len(candidate)}"
            )
        count = len(reference)
    elif mode == KLMode.FREE_RUNNING_TOPK:
        count = min(len(reference), len(candidate))
        if divergence is not None:
            count = min(count, divergence + 1)
    else:
        raise ValueError(f"unknown KL mode {mode!r}")
    comparison = DistributionComparison(mode=str(mode), positions=count, top1_agreements=0)
    for i in range(count):
        ref, cand = reference[i], candidate[i]
        if top1(ref) == top1(cand):
            comparison.top1_agreements += 1
        comparison.kl.append(kl_divergence(ref, cand))
    return comparison


# -- one sample -------------------------------------------------------------------------------------------


@dataclass
class SideOutput:
    """What one side produced for one case: text, its tokens and (if asked for) their top-k logprobs."""

    text: str
    tokens: Sequence[Token]
    top_logprobs: Sequence[TopK] | None = None


def score_sample(
    reference: SideOutput,
    candidate: SideOutput,
    *,
    expected: str | None = None,
    match_rule: str | None = None,
    candidate_scored_reference: Sequence[TopK] | None = None,
) -> dict[str, Any]:
    """Every per-sample metric, as a JSON-ready dict (the sample row of a run stores it as is).

    `candidate_scored_reference` is the candidate's distribution at each position of the reference's
    output (teacher forcing, e.g. vLLM prompt_logprobs); without it, but with both sides' top_logprobs,
    the KL is the free-running top-k variant and says so in `kl_mode`.
    """
    divergence = first_divergence(reference.tokens, candidate.tokens)
    score: dict[str, Any] = {
        "exact_match": exact_match(reference.text, candidate.text),
        "first_divergence": divergence,
        "token_agreement": token_agreement(reference.tokens, candidate.tokens),
        "chrf": chrf(reference.text, candidate.text),
        "reference_tokens": len(reference.tokens),
        "candidate_tokens": len(candidate.tokens),
        "length_difference": length_difference(reference.tokens, candidate.tokens),
        "reference_correct": None,
        "candidate_correct": None,
        "flip": None,
        "kl_mode": None,
        "kl_positions": 0,
        "top1_agreement": None,
        "mean_kl": None,
        "max_kl": None,
        "top1_matches": 0,
        "kl_sum": 0.0,
    }
    if expected is not None and match_rule is not None:
        ref_ok = answer_matches(reference.text, expected, match_rule)
        cand_ok = answer_matches(candidate.text, expected, match_rule)
        score["reference_correct"] = ref_ok
        score["candidate_correct"] = cand_ok
        score["flip"] = None if ref_ok == cand_ok else ("right_to_wrong" if ref_ok else "wrong_to_right")
    comparison: DistributionComparison | None = None
    if reference.top_logprobs is not None and candidate_scored_reference is not None:
        comparison = compare_distributions(
            reference.top_logprobs, candidate_scored_reference, KLMode.TEACHER_FORCED
        )
    elif reference.top_logprobs is not None and candidate.top_logprobs is not None:
        comparison = compare_distributions(
            reference.top_logprobs, candidate.top_logprobs, KLMode.FREE_RUNNING_TOPK, divergence=divergence
        )
    if comparison is not None:
        score.update(
            kl_mode=comparison.mode,
            kl_positions=comparison.positions,
            top1_agreement=comparison.top1_agreement,
            mean_kl=comparison.mean_kl,
            max_kl=comparison.max_kl,
            top1_matches=comparison.top1_agreements,
            kl_sum=sum(comparison.kl),
        )
    return score


# -- a run ------------------------------------------------------------------------------------------------


def summarize(scores: Iterable[Mapping[str, Any]], confidence: float = 0.95) -> dict[str, Any]:
    """Run-level figures from per-sample scores (score_sample's dicts).

    Means over samples: exact match rate, token agreement, chrF, length difference. Pooled over positions
    (every scored token weighs the same, whichever sample it is in): top-1 agreement and mean KL, each
    reported per KL mode since the two modes measure different things. Flips over the samples with an
    expected answer.
    """
    rows = list(scores)
    n = len(rows)

    def mean(key: str) -> float | None:
        values = [r[key] for r in rows if r.get(key) is not None]
        return sum(values) / len(values) if values else None

    pairs = [
        (bool(r["reference_correct"]), bool(r["candidate_correct"]))
        for r in rows
        if r.get("reference_correct") is not None and r.get("candidate_correct") is not None
    ]
    by_mode: dict[str, dict[str, Any]] = {}
    for r in rows:
        mode = r.get("kl_mode")
        if not mode or not r.get("kl_positions"):
            continue
        acc = by_mode.setdefault(mode, {"samples": 0, "positions": 0, "top1_matches": 0, "kl_sum": 0.0})
        acc["samples"] += 1
        acc["positions"] += r["kl_positions"]
        acc["top1_matches"] += r["top1_matches"]
        acc["kl_sum"] += r["kl_sum"]
    distributions = {
        mode: {
            "samples": acc["samples"],
            "positions": acc["positions"],
            "top1_agreement": acc["top1_matches"] / acc["positions"],
            "mean_kl": acc["kl_sum"] / acc["positions"],
        }
        for mode, acc in by_mode.items()
    }
    exact = [bool(r["exact_match"]) for r in rows]
    return {
        "samples": n,
        "exact_match_rate": sum(exact) / n if n else None,
        "token_agreement": mean("token_agreement"),
        "chrf": mean("chrf"),
        "length_difference": mean("length_difference"),
        "flips": flip_table(pairs, confidence).as_dict() if pairs else None,
        "distributions": distributions,
    }
