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

import numpy as np
from sacrebleu.metrics import CHRF

from models_registry.evaluation import stats
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


def kl_divergence(reference: TopK, candidate: TopK) -> float:
    """KL(reference || candidate) in nats at one position, from the two sides' top-k logprob listings.

    The support is the union of both listings plus one "rest" bucket (everything outside the support).
    Listed tokens keep exp(logprob); the mass a side's listing leaves out (tail_mass) is shared evenly by
    the support tokens it did not list and its rest bucket, one share each. When both sides list their
    whole distribution this is the exact KL; with top-k listings it is the top-k approximation documented
    in docs/evaluations.md. Candidate probabilities are floored at KL_FLOOR.
    """
    return kl_and_tail(reference, candidate)[0]


_ARRAY_PATH_FROM = 64  # listings longer than this (both sides together) are summed with numpy
_LOG_FLOOR = math.log(KL_FLOOR)


def kl_and_tail(reference: TopK, candidate: TopK) -> tuple[float, float]:
    """kl_divergence and the larger of the two listings' unlisted mass (tail_mass), in one pass."""
    if len(reference) + len(candidate) > _ARRAY_PATH_FROM:
        return _kl_arrays(reference, candidate)
    exp, log = math.exp, math.log
    p_rest, q_rest = tail_mass(reference), tail_mass(candidate)
    common = len(reference.keys() & candidate.keys())
    # Each side's unlisted mass: one share per support token it did not list, plus its rest bucket.
    p_share = p_rest / (len(candidate) - common + 1)
    q_share = q_rest / (len(reference) - common + 1)
    lq_share = max(log(q_share), _LOG_FLOOR) if q_share > 0.0 else _LOG_FLOOR
    floor = _LOG_FLOOR
    total = 0.0
    for tok, lp in reference.items():
        if lp == -math.inf:
            continue
        lq = candidate.get(tok)
        total += exp(lp) * (lp - (lq_share if lq is None else (lq if lq > floor else floor)))
    if p_share > 0.0:
        lp_share = log(p_share)
        for tok, lq in candidate.items():
            if tok not in reference:
                total += p_share * (lp_share - (lq if lq > floor else floor))
        total += p_share * (lp_share - lq_share)  # the rest bucket
    return max(0.0, total), max(p_rest, q_rest)


def _values(listing: TopK, keys: Any) -> np.ndarray:
    return np.fromiter(map(listing.__getitem__, keys), dtype=float, count=len(keys))


def _kl_arrays(reference: TopK, candidate: TopK) -> tuple[float, float]:
    """kl_and_tail with numpy, for long listings: the same completion, floor and sums, as arrays."""
    common = reference.keys() & candidate.keys()
    only_ref = reference.keys() - common
    only_cand = candidate.keys() - common
    p_rest, q_rest = tail_mass(reference), tail_mass(candidate)
    p_share = p_rest / (len(only_cand) + 1)
    q_share = q_rest / (len(only_ref) + 1)
    lq_share = max(math.log(q_share), _LOG_FLOOR) if q_share > 0.0 else _LOG_FLOOR
    total = 0.0
    with np.errstate(invalid="ignore"):  # exp(-inf) * -inf for an unlisted-probability entry: dropped
        if common:
            lp, lq = _values(reference, common), _values(candidate, common)
            total += float(np.nansum(np.exp(lp) * (lp - np.maximum(lq, _LOG_FLOOR))))
        if only_ref:
            lp = _values(reference, only_ref)
            total += float(np.nansum(np.exp(lp) * (lp - lq_share)))
    if p_share > 0.0:
        lp_share = math.log(p_share)
        if only_cand:
            lq = _values(candidate, only_cand)
            total += float(np.sum(p_share * (lp_share - np.maximum(lq, _LOG_FLOOR))))
        total += p_share * (lp_share - lq_share)  # the rest bucket
    return max(0.0, total), max(p_rest, q_rest)


def top1(listed: TopK) -> Token | None:
    """The most likely token of a listing (the first listed among equals); None for an empty listing."""
    if not listed:
        return None
    # max() keeps the first of equal maxima, as a scan in listing order would.
    return max(listed, key=listed.__getitem__)


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


# A listing that leaves out at most this much probability (on either side) is the whole distribution: what
# an engine's full-vocabulary listing loses to float rounding and near-zero tokens is far below it.
FULL_COVERAGE_TAIL = 1e-3


def tail_mass(listed: TopK) -> float:
    """The probability a listing leaves out: 1 - the listed mass (0 for a whole distribution)."""
    if len(listed) > _ARRAY_PATH_FROM:
        values = np.fromiter(listed.values(), dtype=float, count=len(listed))
        return max(0.0, 1.0 - float(np.exp(values).sum()))
    return max(0.0, 1.0 - sum(math.exp(lp) for lp in listed.values()))


class KLMethod(StrEnum):
    """How much of each distribution the KL saw (docs/evaluations.md, "Exact or top-k")."""

    # Both sides listed (all but FULL_COVERAGE_TAIL of) their whole distribution: the KL is exact.
    FULL_VOCABULARY = "full_vocabulary"
    # Top-k listings, the unlisted mass spread evenly (see kl_divergence): an approximation whose error
    # grows with the tail mass the run reports.
    TOP_K = "top_k"


class KLKeys(StrEnum):
    """What the two sides' listings were keyed by (docs/evaluations.md, "Exact or top-k")."""

    # Token ids (vLLM's prompt_logprobs, the llama.cpp engine's /inferchain/v1/token_logprobs): every
    # token of the vocabulary keeps its own entry.
    TOKEN_IDS = "token_ids"
    # Token text (chat logprobs, llama-cpp-python's echo listings): tokens that decode alike share one
    # entry and the others' mass is lost, so even a whole-vocabulary listing is not the whole distribution.
    TOKEN_TEXT = "token_text"


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
    # The larger of the two sides' unlisted mass, per position.
    tails: list[float] = field(default_factory=list)
    # Per position where both listings hold the token the reference wrote there: the candidate's
    # probability of it minus the reference's, and each side's -log p of it (perplexity).
    dp: list[float] = field(default_factory=list)
    nll_reference: list[float] = field(default_factory=list)
    nll_candidate: list[float] = field(default_factory=list)

    @property
    def method(self) -> str:
        tail = max(self.tails, default=0.0)
        return KLMethod.FULL_VOCABULARY if tail <= FULL_COVERAGE_TAIL else KLMethod.TOP_K

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
    tokens: Sequence[Token] | None = None,
) -> DistributionComparison:
    """Per-position top-1 agreement and KL(reference || candidate).

    teacher_forced: both lists describe the same positions of the reference's text (the candidate's came
    from scoring that text), so they must be equally long; every position counts.

    free_running_topk: each list is a side's own generation; positions 0..divergence (the first
    divergence index, inclusive) are the ones where both sides had seen the same text, and only they
    count; with divergence None (identical outputs) all common positions count.

    `tokens`, teacher-forced only: the reference's token at each position (keyed as the listings are),
    for the change in its probability and the perplexity of each side on the reference's text.
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
        kl, tail = kl_and_tail(ref, cand)
        comparison.kl.append(kl)
        comparison.tails.append(tail)
        if tokens is not None and mode == KLMode.TEACHER_FORCED and i < len(tokens):
            tok = tokens[i]
            if tok in ref and tok in cand:
                comparison.dp.append(math.exp(cand[tok]) - math.exp(ref[tok]))
                comparison.nll_reference.append(-ref[tok])
                comparison.nll_candidate.append(-cand[tok])
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
    reference_scored_reference: Sequence[TopK] | None = None,
    kl_k: int | None = None,
    forced_tokens: Sequence[Token] | None = None,
    keep_positions: bool = False,
) -> dict[str, Any]:
    """Every per-sample metric, as a JSON-ready dict (the sample row of a run stores it as is).

    `candidate_scored_reference` is the candidate's distribution at each position of the reference's
    output (teacher forcing, e.g. vLLM prompt_logprobs); without it, but with both sides' top_logprobs,
    the KL is the free-running top-k variant and says so in `kl_mode`. `reference_scored_reference` is
    the reference's own distribution there, asked for with the same (larger) k; without it the
    reference's generation listings stand in. `kl_k` is the k the listings were asked for (-1: all).
    `forced_tokens`: the reference's tokens keyed as the teacher-forced listings are (token ids when
    they are keyed by id), for the reference token's probability on each side; default its token texts.
    Given, the teacher-forced listings count as keyed by token id (`kl_keys`), else by token text.
    `keep_positions`: also return the per-position KL list under "position_kl" (the runner stores it on
    the sample row, not in the scores), so it is not computed twice.
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
        "kl_method": None,
        "kl_keys": None,
        "kl_k": None,
        "tail_mass_max": None,
        "dp_positions": 0,
        "dp_sum": 0.0,
        "dp_sq_sum": 0.0,
        "nll_reference_sum": 0.0,
        "nll_candidate_sum": 0.0,
    }
    if expected is not None and match_rule is not None:
        ref_ok = answer_matches(reference.text, expected, match_rule)
        cand_ok = answer_matches(candidate.text, expected, match_rule)
        score["reference_correct"] = ref_ok
        score["candidate_correct"] = cand_ok
        score["flip"] = None if ref_ok == cand_ok else ("right_to_wrong" if ref_ok else "wrong_to_right")
    comparison: DistributionComparison | None = None
    if candidate_scored_reference is not None and (
        reference_scored_reference is not None or reference.top_logprobs is not None
    ):
        ref_listings = reference_scored_reference
        if ref_listings is None:
            ref_listings = reference.top_logprobs or []
        comparison = compare_distributions(
            ref_listings,
            candidate_scored_reference,
            KLMode.TEACHER_FORCED,
            tokens=forced_tokens if forced_tokens is not None else reference.tokens,
        )
    elif reference.top_logprobs is not None and candidate.top_logprobs is not None:
        comparison = compare_distributions(
            reference.top_logprobs, candidate.top_logprobs, KLMode.FREE_RUNNING_TOPK, divergence=divergence
        )
    if comparison is not None:
        # What the listings were keyed by: token ids when the teacher-forced tokens are ids, else text.
        by_id = forced_tokens is not None and comparison.mode == KLMode.TEACHER_FORCED
        keys = KLKeys.TOKEN_IDS if by_id else KLKeys.TOKEN_TEXT
        score.update(
            kl_mode=comparison.mode,
            kl_positions=comparison.positions,
            top1_agreement=comparison.top1_agreement,
            mean_kl=comparison.mean_kl,
            max_kl=comparison.max_kl,
            top1_matches=comparison.top1_agreements,
            kl_sum=sum(comparison.kl),
            kl_method=comparison.method,
            kl_keys=keys.value,
            kl_k=kl_k,
            tail_mass_max=max(comparison.tails, default=0.0),
            dp_positions=len(comparison.dp),
            dp_sum=sum(comparison.dp),
            dp_sq_sum=sum(d * d for d in comparison.dp),
            nll_reference_sum=sum(comparison.nll_reference),
            nll_candidate_sum=sum(comparison.nll_candidate),
        )
    if keep_positions:
        score["position_kl"] = comparison.kl if comparison is not None else []
    return score


# -- a run ------------------------------------------------------------------------------------------------


def _distribution_summary(
    rows: list[Mapping[str, Any]], kls: list[float], confidence: float
) -> dict[str, Any]:
    """One KL mode's pooled figures over its samples (rows) and every position's KL (kls)."""
    positions = sum(r["kl_positions"] for r in rows)
    dp_positions = sum(r.get("dp_positions") or 0 for r in rows)
    dp_sum = sum(r.get("dp_sum") or 0.0 for r in rows)
    nll_ref = sum(r.get("nll_reference_sum") or 0.0 for r in rows)
    nll_cand = sum(r.get("nll_candidate_sum") or 0.0 for r in rows)
    methods = {r.get("kl_method") for r in rows}
    tails = [r["tail_mass_max"] for r in rows if r.get("tail_mass_max") is not None]
    ks = {int(r["kl_k"]) for r in rows if r.get("kl_k") is not None}
    keys = {str(r["kl_keys"]) for r in rows if r.get("kl_keys")}
    return {
        "samples": len(rows),
        "positions": positions,
        "top1_agreement": sum(r["top1_matches"] for r in rows) / positions,
        "mean_kl": sum(r["kl_sum"] for r in rows) / positions,
        "kl_ci": stats.describe_interval(
            stats.bootstrap_ratio_ci(
                [r["kl_sum"] for r in rows], [r["kl_positions"] for r in rows], confidence
            )
        ),
        "kl_quantiles": stats.quantiles(kls),
        # Exact only when every sample's listings covered the whole distribution on both sides.
        "method": KLMethod.FULL_VOCABULARY.value
        if methods == {KLMethod.FULL_VOCABULARY.value}
        else KLMethod.TOP_K.value,
        # token_ids or token_text when every sample's listings were keyed so, else mixed (None: older runs).
        "keys": (next(iter(keys)) if len(keys) == 1 else "mixed") if keys else None,
        "k": -1 if -1 in ks else max(ks, default=None),
        "tail_mass_max": max(tails) if tails else None,
        "dp_positions": dp_positions,
        "mean_dp": dp_sum / dp_positions if dp_positions else None,
        "rms_dp": math.sqrt(sum(r.get("dp_sq_sum") or 0.0 for r in rows) / dp_positions)
        if dp_positions
        else None,
        # exp(mean NLL of the candidate) / exp(mean NLL of the reference), on the reference's own text.
        "perplexity_ratio": math.exp((nll_cand - nll_ref) / dp_positions) if dp_positions else None,
    }


def _flips(rows: list[Mapping[str, Any]], confidence: float) -> dict[str, Any] | None:
    pairs = [
        (bool(r["reference_correct"]), bool(r["candidate_correct"]))
        for r in rows
        if r.get("reference_correct") is not None and r.get("candidate_correct") is not None
    ]
    if not pairs:
        return None
    table = flip_table(pairs, confidence)
    out = table.as_dict()
    out["mcnemar_p"] = stats.mcnemar_exact(table.right_to_wrong, table.wrong_to_right)
    out["recovery"] = stats.recovery(table.reference_accuracy, table.candidate_accuracy)
    return out


def summarize(
    scores: Iterable[Mapping[str, Any]],
    confidence: float = 0.95,
    *,
    position_kl: Sequence[Sequence[float]] | None = None,
    tags: Sequence[Sequence[str]] | None = None,
) -> dict[str, Any]:
    """Run-level figures from per-sample scores (score_sample's dicts).

    Means over samples: exact match rate, token agreement, chrF (with a bootstrap interval), length
    difference. Pooled over positions (every scored token weighs the same, whichever sample it is in):
    top-1 agreement, mean KL (bootstrap interval by sample), change in the reference token's probability,
    perplexity ratio, each reported per KL mode since the two modes measure different things; KL
    quantiles over every position (`position_kl`, one list per sample, in the order of `scores`). Flips
    over the samples with an expected answer, with McNemar's exact p and recovery %. With `tags` (one
    list per sample), the same headline figures per tag.
    """
    rows = list(scores)
    n = len(rows)
    kls = list(position_kl) if position_kl is not None else [[] for _ in rows]
    if len(kls) != n:
        raise ValueError(f"{len(kls)} per-position KL lists for {n} samples")

    def mean(key: str) -> float | None:
        values = [r[key] for r in rows if r.get(key) is not None]
        return sum(values) / len(values) if values else None

    by_mode: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        mode = r.get("kl_mode")
        if mode and r.get("kl_positions"):
            by_mode.setdefault(mode, []).append(i)
    distributions = {
        mode: _distribution_summary(
            [rows[i] for i in idx], [float(k) for i in idx for k in kls[i]], confidence
        )
        for mode, idx in by_mode.items()
    }
    exact = [bool(r["exact_match"]) for r in rows]
    chrfs = [float(r["chrf"]) for r in rows if r.get("chrf") is not None]
    out: dict[str, Any] = {
        "samples": n,
        "exact_match_rate": sum(exact) / n if n else None,
        "token_agreement": mean("token_agreement"),
        "chrf": mean("chrf"),
        "chrf_ci": stats.describe_interval(stats.bootstrap_mean_ci(chrfs, confidence)),
        "length_difference": mean("length_difference"),
        "flips": _flips(rows, confidence),
        "distributions": distributions,
    }
    if tags is not None:
        if len(tags) != n:
            raise ValueError(f"{len(tags)} tag lists for {n} samples")
        out["by_tag"] = _by_tag(rows, tags, confidence)
    return out


def _by_tag(
    rows: list[Mapping[str, Any]], tags: Sequence[Sequence[str]], confidence: float
) -> dict[str, dict[str, Any]]:
    """Per tag: samples, exact match rate, chrF, mean KL (teacher-forced where there is one) and flips."""
    members: dict[str, list[int]] = {}
    for i, sample_tags in enumerate(tags):
        for tag in sorted(set(sample_tags or [])):
            members.setdefault(str(tag), []).append(i)
    out: dict[str, dict[str, Any]] = {}
    for tag in sorted(members):
        of = [rows[i] for i in members[tag]]
        kl_rows = [r for r in of if r.get("kl_mode") == KLMode.TEACHER_FORCED and r.get("kl_positions")]
        if not kl_rows:
            kl_rows = [r for r in of if r.get("kl_positions")]
        positions = sum(r["kl_positions"] for r in kl_rows)
        flips = _flips(of, confidence)
        chrfs = [float(r["chrf"]) for r in of if r.get("chrf") is not None]
        out[tag] = {
            "samples": len(of),
            "exact_match_rate": sum(bool(r["exact_match"]) for r in of) / len(of),
            "chrf": sum(chrfs) / len(chrfs) if chrfs else None,
            "mean_kl": sum(r["kl_sum"] for r in kl_rows) / positions if positions else None,
            "reference_accuracy": flips["reference_accuracy"] if flips else None,
            "candidate_accuracy": flips["candidate_accuracy"] if flips else None,
            "flips": flips["flips"] if flips else None,
            "recovery": flips["recovery"] if flips else None,
        }
    return out
