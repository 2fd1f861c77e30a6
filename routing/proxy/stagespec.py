"""A stage chain's JSON form, parsed and checked (the API refuses what fails here; the proxy's snapshot
loader skips it): `[{"kind": ..., "name": ..., "config": {...}}, ...]`.

A chain is optional pre-stages, exactly one `generate` step (today's pool choice; `config.pool` names
the pool, or the alias's policy picks one), then optional post-stages. Kinds:

- `generate`: `{"pool": "<pool name>"}` (optional).
- `guard`: `{"terms": [...], "regex": false, "action": "block" | "mask"}`: the tenant's sensitive terms,
  matched case-insensitively in the prompt (before generation) or in the answer (after it).
- `classify`: `{"rules": [{"match": {...}, "pool": "<pool name>"}, ...]}`: the first rule whose conditions
  all hold sends the request to its pool (else the generate step's choice stands). Conditions:
  `min_prompt_tokens`, `max_prompt_tokens`, `keywords` (any of them, case-insensitive; regular
  expressions with `"regex": true`), `code` (the prompt holds code or not), `images` (image parts or
  not), `min_messages`, `max_messages` (conversation depth).
- `schema` (post only): `{"hold": false}`: when the client asked for `response_format` `json_object` or
  `json_schema`, the complete answer must be JSON (an object) that matches the schema; else a 502
  `response_format_mismatch` error (on a stream: an error event before `[DONE]`, or, with `"hold": true`,
  the text is held until it is checked). No `response_format`: the answer passes untouched.
- `chain`: `{"chain": "<chain name>"}`: another chain's stages in its place (its own generate step
  must then be this chain's only one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

KINDS = ("generate", "guard", "classify", "schema", "chain")
CLASSIFY_MATCH = {
    "min_prompt_tokens",
    "max_prompt_tokens",
    "keywords",
    "regex",
    "code",
    "images",
    "min_messages",
    "max_messages",
}
GUARD_ACTIONS = ("block", "mask")
MAX_TERMS = 1000
MAX_TERM_CHARS = 200


class ChainError(ValueError):
    """Why a chain cannot be saved, in words an admin can act on."""


@dataclass(frozen=True, slots=True)
class StageSpec:
    kind: str
    name: str
    config: dict[str, Any] = field(default_factory=dict)


def guard_pattern(terms: list[str], regex: bool) -> re.Pattern[str]:
    """One case-insensitive alternation of the terms (escaped unless `regex`)."""
    parts = terms if regex else [re.escape(t) for t in terms]
    return re.compile("|".join(f"(?:{p})" for p in parts), re.IGNORECASE)


def _guard(config: dict[str, Any], where: str) -> None:
    terms = config.get("terms")
    if not isinstance(terms, list) or not terms or not all(isinstance(t, str) and t for t in terms):
        raise ChainError(f"{where}.config.terms must be a non-empty list of non-empty strings.")
    if len(terms) > MAX_TERMS:
        raise ChainError(f"{where}.config.terms has {len(terms)} terms; at most {MAX_TERMS}.")
    regex = config.get("regex", False)
    if not isinstance(regex, bool):
        raise ChainError(f"{where}.config.regex must be true or false.")
    for j, term in enumerate(terms):
        if len(term) > MAX_TERM_CHARS:
            raise ChainError(f"{where}.config.terms[{j}] is longer than {MAX_TERM_CHARS} characters.")
        if regex:
            try:
                re.compile(term)
            except re.error as exc:
                raise ChainError(
                    f"{where}.config.terms[{j}] is not a valid regular expression: {exc}."
                ) from None
    if config.get("action", "block") not in GUARD_ACTIONS:
        raise ChainError(f"{where}.config.action must be one of {', '.join(GUARD_ACTIONS)}.")
    if regex and "max_match_chars" in config:
        size = config["max_match_chars"]
        if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_TERM_CHARS:
            raise ChainError(f"{where}.config.max_match_chars must be an integer from 1 to {MAX_TERM_CHARS}.")


def _classify(config: dict[str, Any], where: str) -> None:
    rules = config.get("rules")
    if not isinstance(rules, list) or not rules:
        raise ChainError(
            f"{where}.config.rules must be a non-empty list of {{'match': {{...}}, 'pool': name}}."
        )
    for j, rule in enumerate(rules):
        at = f"{where}.config.rules[{j}]"
        if not isinstance(rule, dict) or not isinstance(rule.get("pool"), str) or not rule["pool"]:
            raise ChainError(f"{at} needs a 'pool' name.")
        match = rule.get("match") or {}
        if not isinstance(match, dict):
            raise ChainError(f"{at}.match must be an object.")
        unknown = set(match) - CLASSIFY_MATCH
        if unknown:
            raise ChainError(
                f"{at}.match has unknown conditions {sorted(unknown)}; known: {sorted(CLASSIFY_MATCH)}."
            )
        for name in ("min_prompt_tokens", "max_prompt_tokens", "min_messages", "max_messages"):
            value = match.get(name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ChainError(f"{at}.match.{name} must be a non-negative integer.")
        for name in ("code", "images", "regex"):
            if name in match and not isinstance(match[name], bool):
                raise ChainError(f"{at}.match.{name} must be true or false.")
        keywords = match.get("keywords")
        if keywords is not None:
            if (
                not isinstance(keywords, list)
                or not keywords
                or not all(isinstance(k, str) and k for k in keywords)
            ):
                raise ChainError(f"{at}.match.keywords must be a non-empty list of non-empty strings.")
            if match.get("regex"):
                for k, word in enumerate(keywords):
                    try:
                        re.compile(word)
                    except re.error as exc:
                        raise ChainError(
                            f"{at}.match.keywords[{k}] is not a valid regular expression: {exc}."
                        ) from None


def _schema(config: dict[str, Any], where: str) -> None:
    unknown = set(config) - {"hold"}
    if unknown:
        raise ChainError(f"{where}.config has unknown keys {sorted(unknown)}; known: ['hold'].")
    if not isinstance(config.get("hold", False), bool):
        raise ChainError(f"{where}.config.hold must be true or false.")


def parse_stages(raw: Any) -> list[StageSpec]:
    """The chain's stages from JSON; raises ChainError on the first problem (with its place)."""
    if not isinstance(raw, list) or not raw:
        raise ChainError("stages must be a non-empty list; a chain needs at least its generate step.")
    out: list[StageSpec] = []
    names: set[str] = set()
    for i, item in enumerate(raw):
        where = f"stages[{i}]"
        if not isinstance(item, dict):
            raise ChainError(f"{where} must be an object with a 'kind'.")
        unknown = set(item) - {"kind", "name", "config"}
        if unknown:
            raise ChainError(f"{where} has unknown keys: {sorted(unknown)}.")
        kind = item.get("kind")
        if kind not in KINDS:
            raise ChainError(f"{where}.kind must be one of {', '.join(KINDS)} (got {kind!r}).")
        name = item.get("name") or f"{kind}{i}"
        if not isinstance(name, str) or len(name) > 64:
            raise ChainError(f"{where}.name must be a string of at most 64 characters.")
        if name in names:
            raise ChainError(f"{where}.name '{name}' is used twice; stage names are unique in a chain.")
        names.add(name)
        config = item.get("config") or {}
        if not isinstance(config, dict):
            raise ChainError(f"{where}.config must be an object.")
        if kind == "guard":
            _guard(config, where)
        elif kind == "classify":
            _classify(config, where)
        elif kind == "schema":
            _schema(config, where)
        elif kind == "generate":
            pool = config.get("pool")
            if pool is not None and (not isinstance(pool, str) or not pool):
                raise ChainError(f"{where}.config.pool must be a pool name.")
        elif kind == "chain" and (not isinstance(config.get("chain"), str) or not config["chain"]):
            raise ChainError(f"{where}.config.chain must name another chain.")
        out.append(StageSpec(kind=kind, name=name, config=config))
    return out


def expand(name: str, chains: dict[str, list[StageSpec]], trail: tuple[str, ...] = ()) -> list[StageSpec]:
    """`name`'s stages with every `chain` stage replaced by that chain's (expanded) stages.

    Raises ChainError for a chain that includes itself, directly or through others, or one not found.
    """
    if name in trail:
        raise ChainError(f"cycle: {' -> '.join((*trail, name))}.")
    stages = chains.get(name)
    if stages is None:
        raise ChainError(f"no chain named '{name}' (included by '{trail[-1]}').")
    out: list[StageSpec] = []
    for stage in stages:
        if stage.kind == "chain":
            out.extend(expand(stage.config["chain"], chains, (*trail, name)))
        else:
            out.append(stage)
    return out


def split(stages: list[StageSpec]) -> tuple[list[StageSpec], StageSpec, list[StageSpec]]:
    """(pre-stages, the generate step, post-stages) of an expanded chain; exactly one generate step."""
    at = [i for i, s in enumerate(stages) if s.kind == "generate"]
    if not at:
        raise ChainError('the chain has no generate step; add {"kind": "generate"} where generation happens.')
    if len(at) > 1:
        raise ChainError(
            f"the chain has {len(at)} generate steps (with its included chains); it needs exactly one."
        )
    i = at[0]
    late = [s.name for s in stages[i + 1 :] if s.kind == "classify"]
    if late:
        raise ChainError(
            f"the classify stage '{late[0]}' comes after the generate step; it picks the pool: move it up."
        )
    early = [s.name for s in stages[:i] if s.kind == "schema"]
    if early:
        raise ChainError(
            f"the schema stage '{early[0]}' comes before the generate step; it checks the answer: "
            "move it down."
        )
    return stages[:i], stages[i], stages[i + 1 :]


def pools_named(stages: list[StageSpec]) -> list[tuple[str, str]]:
    """(stage name, pool name) of every stage that points at a pool."""
    named = [(s.name, s.config["pool"]) for s in stages if s.kind == "generate" and s.config.get("pool")]
    for s in stages:
        if s.kind == "classify":
            named.extend((s.name, rule["pool"]) for rule in s.config["rules"])
    return named
