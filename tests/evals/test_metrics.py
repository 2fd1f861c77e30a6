"""Each metric on examples computed by hand (the same examples are worked through in docs/evaluations.md)."""

from __future__ import annotations

import math

import pytest

from models_registry.evaluation.metrics import (
    FlipTable,
    KLMode,
    SideOutput,
    chrf,
    compare_distributions,
    exact_match,
    first_divergence,
    flip_table,
    kl_divergence,
    length_difference,
    listing_from_chat,
    listing_from_completion,
    listing_from_prompt_logprobs,
    paired_difference_ci,
    score_sample,
    summarize,
    token_agreement,
    wilson_interval,
)
from models_registry.evaluation.rules import (
    answer_matches,
    check_expected,
    normalize_answer,
    parse_choice,
    parse_number,
)

ln = math.log


def test_exact_match_is_character_for_character() -> None:
    assert exact_match("Paris.", "Paris.")
    assert not exact_match("Paris.", "Paris")
    assert not exact_match("Paris", "paris")


def test_first_divergence() -> None:
    assert first_divergence(["a", "b", "c"], ["a", "b", "c"]) is None
    assert first_divergence(["a", "b", "c"], ["a", "x", "c"]) == 1
    assert first_divergence(["a", "b", "c"], ["x", "b", "c"]) == 0
    # One a prefix of the other: they part where the shorter ends.
    assert first_divergence(["a", "b"], ["a", "b", "c", "d"]) == 2
    assert first_divergence([], ["a"]) == 0
    assert first_divergence([], []) is None


def test_token_agreement_counts_same_tokens_in_the_same_places() -> None:
    assert token_agreement(["a", "b", "c", "d"], ["a", "x", "c", "d"]) == 3 / 4
    # Over the longer length: 2 shared positions of 4.
    assert token_agreement(["a", "b"], ["a", "b", "c", "d"]) == 2 / 4
    # An inserted token shifts the rest: only position 0 agrees.
    assert token_agreement(["a", "b", "c"], ["a", "z", "b", "c"]) == 1 / 4
    assert token_agreement([], []) == 1.0


def test_chrf_from_sacrebleu() -> None:
    assert chrf("the cat sat", "the cat sat") == 100.0
    assert chrf("", "") == 100.0
    assert chrf("the cat sat", "") == 0.0
    partial = chrf("the cat sat", "the cat")
    assert 0.0 < partial < 100.0
    assert partial == pytest.approx(55.771, abs=1e-3)


def test_length_difference_is_candidate_minus_reference() -> None:
    assert length_difference(["a", "b", "c"], ["a"]) == -2
    assert length_difference(10, 14) == 4


# -- answer matching --------------------------------------------------------------------------------------


def test_exact_rule_strips_surrounding_whitespace_only() -> None:
    assert answer_matches("  Paris\n", "Paris", "exact")
    assert not answer_matches("paris", "Paris", "exact")


def test_normalized_rule() -> None:
    assert normalize_answer("  The Eiffel-Tower, in PARIS!  ") == "eiffeltower in paris"
    assert answer_matches("The Pacific Ocean.", "pacific ocean", "normalized")
    assert not answer_matches("The Pacific Ocean is largest", "pacific ocean", "normalized")


def test_regex_rule_searches_anywhere() -> None:
    assert answer_matches("I believe it is Paris, France.", r"(?i)\bparis\b", "regex")
    assert not answer_matches("Parisian food", r"(?i)\bparis\b", "regex")
    assert not answer_matches("paris", r"\bParis\b", "regex")


def test_numeric_rule_takes_the_last_number() -> None:
    assert parse_number("2 + 3 = 5") == 5.0
    assert parse_number("It costs 1,234.5 dollars") == 1234.5
    assert parse_number("-7") == -7.0
    assert parse_number("no digits") is None
    assert answer_matches("2 + 3 = 5", "5", "numeric")
    assert answer_matches("The answer is 12.0", "12", "numeric")
    assert answer_matches("1,000", "1000", "numeric")
    assert not answer_matches("5 is not 2 + 2 = 4", "5", "numeric")
    assert not answer_matches("five", "5", "numeric")


def test_choice_rule_reads_the_option_letter() -> None:
    assert parse_choice("B") == "B"
    assert parse_choice("(c) Paris") == "C"
    assert parse_choice("B) Paris") == "B"
    assert parse_choice("D. Mars") == "D"
    assert parse_choice("I think the answer is C because") == "C"
    assert parse_choice("Answer: a") == "A"
    assert parse_choice("I do not know") is None
    assert answer_matches("The answer is (B).", "b", "choice")
    assert not answer_matches("A) Berlin", "B", "choice")


def test_unknown_rule_and_unusable_expected_answers() -> None:
    with pytest.raises(ValueError):
        answer_matches("x", "x", "fuzzy")
    assert check_expected("x", "fuzzy") is not None
    assert check_expected("([a-z", "regex") is not None
    assert check_expected("seven", "numeric") is not None
    assert check_expected("AB", "choice") is not None
    assert check_expected("42", "numeric") is None
    assert check_expected("b", "choice") is None


# -- flips and the confidence interval --------------------------------------------------------------------


def test_flip_table_counts_the_four_cells() -> None:
    # (reference correct, candidate correct) for 10 cases.
    pairs = [(True, True)] * 4 + [(True, False)] * 3 + [(False, True)] * 2 + [(False, False)]
    table = flip_table(pairs)
    assert (table.both_right, table.right_to_wrong, table.wrong_to_right, table.both_wrong) == (4, 3, 2, 1)
    assert table.n == 10
    assert table.reference_accuracy == 0.7  # 4 + 3 right of 10
    assert table.candidate_accuracy == 0.6  # 4 + 2 right of 10
    assert table.flips == 5
    assert table.flip_rate == 0.5
    assert table.accuracy_difference == pytest.approx(-0.1)  # (2 - 3) / 10
    # Accuracy alone moved by 0.1; half the answers changed.
    data = table.as_dict()
    assert data["flips"] == 5 and data["difference_ci"][0] < -0.1 < data["difference_ci"][1]


def test_wilson_interval_by_hand() -> None:
    # 45/100, z = 1.959964: centre 0.469207/1.038415 = 0.451849, half 0.099381/1.038415 = 0.095704.
    low, high = wilson_interval(45, 100)
    assert low == pytest.approx(0.356145, abs=1e-6)
    assert high == pytest.approx(0.547554, abs=1e-6)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_newcombe_paired_interval_by_hand() -> None:
    # 40 both right, 5 wrong->right, 15 right->wrong, 40 both wrong (docs/evaluations.md, worked example):
    # candidate 0.45, reference 0.55, difference -0.10; phi = (1600 - 75 - 50) / 2475 = 0.595960;
    # both half-widths are sqrt(2 x 0.0938552^2 x (1 - phi)) -> -0.10 - 0.084369 and
    # sqrt(2 x 0.0975537^2 x (1 - phi)) -> -0.10 + 0.087695.
    low, high = paired_difference_ci(40, 5, 15, 40)
    assert low == pytest.approx(-0.184369, abs=1e-6)
    assert high == pytest.approx(-0.012305, abs=1e-6)
    # The same cells through the table.
    table = FlipTable(both_right=40, right_to_wrong=15, wrong_to_right=5, both_wrong=40)
    assert table.difference_ci == pytest.approx((low, high))


def test_equal_flips_in_both_directions_give_an_interval_around_zero() -> None:
    # Accuracy unchanged (difference 0) although 20 of 100 answers flipped: the interval spans zero.
    low, high = paired_difference_ci(40, 10, 10, 40)
    assert low < 0.0 < high
    assert low == pytest.approx(-high)
    # No case at all: the whole range.
    assert paired_difference_ci(0, 0, 0, 0) == (-1.0, 1.0)
    # All right on both sides: still an interval around 0, inside [-1, 1].
    low, high = paired_difference_ci(10, 0, 0, 0)
    assert -1.0 <= low < 0.0 < high <= 1.0


# -- distributions ----------------------------------------------------------------------------------------


def test_kl_of_two_fixed_distributions_by_hand() -> None:
    # P = (0.5, 0.5), Q = (0.25, 0.75): 0.5 ln 2 + 0.5 ln(2/3) = 0.346574 - 0.202733 = 0.143841 nats.
    p = {"a": ln(0.5), "b": ln(0.5)}
    q = {"a": ln(0.25), "b": ln(0.75)}
    assert kl_divergence(p, q) == pytest.approx(0.143841, abs=1e-6)
    # Not symmetric: KL(Q||P) = 0.25 ln 0.5 + 0.75 ln 1.5 = -0.173287 + 0.304099 = 0.130812.
    assert kl_divergence(q, p) == pytest.approx(0.130812, abs=1e-6)
    assert kl_divergence(p, p) == 0.0


def test_kl_of_top_k_listings_with_the_rest_bucket_by_hand() -> None:
    # P lists a .6, b .3 (0.1 unlisted); Q lists a .5, c .2 (0.3 unlisted). Support {a, b, c} + rest.
    # P: c and rest share 0.1 -> .05 each. Q: b and rest share 0.3 -> .15 each.
    # KL = .6 ln(.6/.5) + .3 ln(.3/.15) + .05 ln(.05/.2) + .05 ln(.05/.15)
    #    = 0.109393 + 0.207944 - 0.069315 - 0.054931 = 0.193092
    p = {"a": ln(0.6), "b": ln(0.3)}
    q = {"a": ln(0.5), "c": ln(0.2)}
    assert kl_divergence(p, q) == pytest.approx(0.193092, abs=1e-6)


def test_teacher_forced_comparison() -> None:
    ref = [{"x": ln(0.9), "y": ln(0.1)}, {"x": ln(0.5), "y": ln(0.5)}, {"z": ln(0.7), "x": ln(0.3)}]
    cand = [{"x": ln(0.9), "y": ln(0.1)}, {"x": ln(0.25), "y": ln(0.75)}, {"x": ln(0.6), "z": ln(0.4)}]
    result = compare_distributions(ref, cand, KLMode.TEACHER_FORCED)
    assert result.positions == 3
    # Top-1: x = x; x (first of a tie) != y; z != x.
    assert result.top1_agreements == 1
    assert result.top1_agreement == pytest.approx(1 / 3)
    # KL: 0, 0.143841 (the fixed pair above), .7 ln(.7/.4) + .3 ln(.3/.6) = 0.391731 - 0.207944 = 0.183787.
    assert result.kl == pytest.approx([0.0, 0.143841, 0.183787], abs=1e-6)
    assert result.mean_kl == pytest.approx((0.143841 + 0.183787) / 3, abs=1e-6)
    assert result.max_kl == pytest.approx(0.183787, abs=1e-6)
    with pytest.raises(ValueError):
        compare_distributions(ref, cand[:2], KLMode.TEACHER_FORCED)


def test_free_running_counts_only_positions_with_the_same_context() -> None:
    same = {"x": ln(0.8), "y": ln(0.2)}
    other = {"y": ln(0.6), "x": ln(0.4)}
    ref = [same, same, same, same]
    cand = [same, other, same, same]
    result = compare_distributions(ref, cand, KLMode.FREE_RUNNING_TOPK, divergence=1)
    assert result.positions == 2  # positions 0 and 1: up to and including the first divergence
    assert result.top1_agreements == 1
    assert result.mode == "free_running_topk"
    assert compare_distributions(ref, cand[:3], KLMode.FREE_RUNNING_TOPK).positions == 3


def test_score_sample_and_summary() -> None:
    ref_lp = [{"Paris": ln(0.9), "Lyon": ln(0.05)}, {".": ln(0.8), "!": ln(0.1)}]
    cand_on_ref = [{"Paris": ln(0.6), "Lyon": ln(0.3)}, {".": ln(0.8), "!": ln(0.1)}]
    reference = SideOutput("Paris.", ["Paris", "."], ref_lp)
    candidate = SideOutput("Lyon.", ["Lyon", "."], None)
    score = score_sample(
        reference,
        candidate,
        expected=r"(?i)\bparis\b",
        match_rule="regex",
        candidate_scored_reference=cand_on_ref,
    )
    assert score["exact_match"] is False
    assert score["first_divergence"] == 0
    assert score["token_agreement"] == 0.5
    assert score["flip"] == "right_to_wrong"
    assert score["kl_mode"] == "teacher_forced"
    assert score["top1_agreement"] == 1.0  # the candidate still ranks Paris first on the reference's text
    # Position 0: P = (.9, .05, rest .05), Q = (.6, .3, rest .1):
    # .9 ln 1.5 + .05 ln(1/6) + .05 ln .5 = 0.364919 - 0.089588 - 0.034657 = 0.240674; position 1: 0.
    assert score["mean_kl"] == pytest.approx(0.240674 / 2, abs=1e-6)
    same = score_sample(
        reference, SideOutput("Paris.", ["Paris", "."], ref_lp), expected="Paris.", match_rule="exact"
    )
    assert same["exact_match"] and same["first_divergence"] is None and same["flip"] is None
    assert same["kl_mode"] == "free_running_topk" and same["mean_kl"] == 0.0
    summary = summarize([score, same])
    assert summary["samples"] == 2
    assert summary["exact_match_rate"] == 0.5
    assert summary["flips"]["right_to_wrong"] == 1 and summary["flips"]["both_right"] == 1
    assert set(summary["distributions"]) == {"teacher_forced", "free_running_topk"}
    assert summary["distributions"]["teacher_forced"]["positions"] == 2


def test_listings_from_the_three_response_shapes() -> None:
    chat_item = {
        "token": " the",
        "logprob": -0.5,
        "bytes": [32, 116, 104, 101],
        "top_logprobs": [{"token": " a", "logprob": -0.2, "bytes": [32, 97]}],
    }
    assert listing_from_chat(chat_item) == {" a": -0.2, " the": -0.5}
    assert listing_from_completion({" the": -0.5, " a": -0.2}) == {" the": -0.5, " a": -0.2}
    entry = {
        "123": {"logprob": -0.5, "rank": 2, "decoded_token": " the"},
        "101": {"logprob": -0.2, "rank": 1, "decoded_token": " a"},
    }
    assert listing_from_prompt_logprobs(entry) == {" the": -0.5, " a": -0.2}
