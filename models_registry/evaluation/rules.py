"""Answer matching: whether an output gives a case's expected answer, under one of five rules.

docs/evaluations.md ("Per sample: the answer") defines each rule with examples. Kept apart from the
metrics (which import sacrebleu) so that the suite models can name the rules cheaply.
"""

from __future__ import annotations

import math
import re
import string
from enum import StrEnum

# -- answers against an expected value --------------------------------------------------------------------


class MatchRule(StrEnum):
    """How an output is compared with a case's expected answer (docs/evaluations.md, "Answer matching")."""

    EXACT = "exact"
    NORMALIZED = "normalized"
    REGEX = "regex"
    NUMERIC = "numeric"
    CHOICE = "choice"


MATCH_RULES: tuple[str, ...] = tuple(rule.value for rule in MatchRule)

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")
_CHOICE_PATTERNS = (
    re.compile(r"^\s*[\(\[]([A-Za-z])[\)\]]"),  # "(B) Paris", "[b]"
    re.compile(r"^\s*([A-Za-z])\s*$"),  # "B" alone
    re.compile(r"^\s*([A-Z])[\)\.:,]"),  # "B) Paris", "B. Paris", "B: Paris" (capital letter only)
)
_STATED_CHOICE = re.compile(r"\banswer\s*(?:is|:)?\s*:?\s*[\(\[]?([A-Za-z])\b", re.IGNORECASE)


def normalize_answer(text: str) -> str:
    """Lower case, punctuation removed, the articles a/an/the removed, whitespace collapsed (SQuAD's rule)."""
    text = text.lower().translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def parse_number(text: str) -> float | None:
    """The last number in the text ("1,234.5", "-7", ".5"), thousands separators removed; None if none."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:  # pragma: no cover - the pattern only matches parseable numbers
        return None


def parse_choice(text: str) -> str | None:
    """The option letter an output picks: "(B)" or "[B]" first, "B" alone, a leading capital "B)", "B.",
    "B:" or "B,", else the letter after "answer is" / "answer:" anywhere; None when there is none."""
    for pattern in _CHOICE_PATTERNS:
        found = pattern.match(text)
        if found:
            return found.group(1).upper()
    stated = _STATED_CHOICE.search(text)
    return stated.group(1).upper() if stated else None


def answer_matches(output: str, expected: str, rule: str) -> bool:
    """Whether an output gives the expected answer under the rule. Unknown rules raise ValueError.

    - exact: equal after stripping surrounding whitespace from both;
    - normalized: equal after normalize_answer on both;
    - regex: `expected` is a Python regular expression found anywhere in the output (re.search; add
      `(?i)` for case-insensitive);
    - numeric: the last number in the output equals float(expected) within 1e-6 relative (1e-9 absolute);
    - choice: the option letter of the output (parse_choice) equals `expected`, case-insensitive.
    """
    match MatchRule(rule):
        case MatchRule.EXACT:
            return output.strip() == expected.strip()
        case MatchRule.NORMALIZED:
            return normalize_answer(output) == normalize_answer(expected)
        case MatchRule.REGEX:
            return re.search(expected, output) is not None
        case MatchRule.NUMERIC:
            got = parse_number(output)
            want = parse_number(expected)
            if got is None or want is None:
                return False
            return math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9)
        case MatchRule.CHOICE:
            return parse_choice(output) == expected.strip().upper()


def check_expected(expected: str, rule: str) -> str | None:
    """Why an expected answer cannot be used with the rule (for suite imports), or None when it can."""
    if rule not in MATCH_RULES:
        return f"Unknown match rule {rule!r}; use one of {', '.join(MATCH_RULES)}."
    if rule == MatchRule.REGEX:
        try:
            re.compile(expected)
        except re.error as exc:
            return f"Invalid regular expression: {exc}."
    if rule == MatchRule.NUMERIC and parse_number(expected) is None:
        return "A numeric answer must contain a number."
    if rule == MatchRule.CHOICE and not re.fullmatch(r"\s*[A-Za-z]\s*", expected):
        return "A choice answer is one option letter, e.g. B."
    return None
