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
  With `"model": {...}` (instead of or after the rules) a small model on a CPU pool labels the prompt
  when no rule matched: `{"pool": ..., "labels": {"<label>": "<pool name>", ...}, "instruction": ...,
  "timeout_ms": ..., "on_failure": ..., "max_tokens": ...}` (see `remote`).
- `cache`: `{"ttl_s": 300, "max_entry_bytes": 262144, "max_entries": 10000, "max_bytes": 67108864}` (all
  optional): answers to deterministic requests (temperature 0 or a seed, one choice) replayed from Redis
  (routing/proxy/answercache.py); a pre-stage only.
- `remote`: `{"pool": "<cpu-postprocess pool>", "instruction": "...", "timeout_ms": 2000,
  "on_failure": "open" | "closed", "max_tokens": 512}`: the pool's engine is asked through
  `/v1/chat/completions` with the instruction as the system message; before generation its reply
  replaces the last user message (or the prompt), after generation it replaces the answer.
  `on_failure: open` lets the request go on as if the stage passed when the call fails or times out,
  `closed` refuses it with a 503 naming the stage.
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

KINDS = ("generate", "guard", "classify", "cache", "remote", "schema", "chain")
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
# The cache stage's settings: (lowest, highest) of each.
CACHE_BOUNDS = {
    "ttl_s": (1, 7 * 24 * 3600),
    "max_entry_bytes": (1024, 8 * 1024 * 1024),
    "max_entries": (1, 1_000_000),
    "max_bytes": (1024, 1024 * 1024 * 1024),
}
CACHE_DEFAULTS = {
    "ttl_s": 300,
    "max_entry_bytes": 256 * 1024,
    "max_entries": 10_000,
    "max_bytes": 64 * 1024 * 1024,
}
# Remote stages (a call to a CPU pool's engine): what a config may ask for.
CPU_ROLE = "cpu-postprocess"
ON_FAILURE = ("open", "closed")
DEFAULT_REMOTE_TIMEOUT_MS = 2000
MAX_REMOTE_TIMEOUT_MS = 600_000
MAX_INSTRUCTION_CHARS = 4000
DEFAULT_REMOTE_MAX_TOKENS = 512
DEFAULT_LABEL_MAX_TOKENS = 8
MAX_LABELS = 32
LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")


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


def _cache(config: dict[str, Any], where: str) -> None:
    unknown = set(config) - set(CACHE_BOUNDS)
    if unknown:
        raise ChainError(f"{where}.config has unknown keys {sorted(unknown)}; known: {sorted(CACHE_BOUNDS)}.")
    for name, (low, high) in CACHE_BOUNDS.items():
        value = config.get(name)
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high
        ):
            raise ChainError(f"{where}.config.{name} must be an integer from {low} to {high}.")
    entry = config.get("max_entry_bytes", CACHE_DEFAULTS["max_entry_bytes"])
    total = config.get("max_bytes", CACHE_DEFAULTS["max_bytes"])
    if entry > total:
        raise ChainError(
            f"{where}.config.max_entry_bytes ({entry}) is larger than max_bytes ({total}); "
            "one entry could never be kept."
        )


def _remote_call(config: dict[str, Any], at: str, *, max_tokens_default: int) -> None:
    """What every call to a CPU pool's engine needs: the pool, its timeout and failure mode, the cap."""
    if not isinstance(config.get("pool"), str) or not config["pool"]:
        raise ChainError(f"{at}.pool must name a pool of role {CPU_ROLE}.")
    timeout = config.get("timeout_ms", DEFAULT_REMOTE_TIMEOUT_MS)
    if not isinstance(timeout, int) or isinstance(timeout, bool) or not 1 <= timeout <= MAX_REMOTE_TIMEOUT_MS:
        raise ChainError(f"{at}.timeout_ms must be an integer from 1 to {MAX_REMOTE_TIMEOUT_MS}.")
    if config.get("on_failure", "open") not in ON_FAILURE:
        raise ChainError(f"{at}.on_failure must be one of {', '.join(ON_FAILURE)}.")
    cap = config.get("max_tokens", max_tokens_default)
    if not isinstance(cap, int) or isinstance(cap, bool) or not 1 <= cap <= 32768:
        raise ChainError(f"{at}.max_tokens must be an integer from 1 to 32768.")
    instruction = config.get("instruction", "")
    if not isinstance(instruction, str) or len(instruction) > MAX_INSTRUCTION_CHARS:
        raise ChainError(f"{at}.instruction must be a string of at most {MAX_INSTRUCTION_CHARS} characters.")


def _remote(config: dict[str, Any], where: str) -> None:
    unknown = set(config) - {"pool", "instruction", "timeout_ms", "on_failure", "max_tokens"}
    if unknown:
        raise ChainError(f"{where}.config has unknown keys: {sorted(unknown)}.")
    _remote_call(config, f"{where}.config", max_tokens_default=DEFAULT_REMOTE_MAX_TOKENS)
    if not config.get("instruction", "").strip():
        raise ChainError(f"{where}.config.instruction must say what the CPU engine is to do.")


def _classify_model(model: Any, where: str) -> None:
    at = f"{where}.config.model"
    if not isinstance(model, dict):
        raise ChainError(f"{at} must be an object: {{'pool': ..., 'labels': {{label: pool}}}}.")
    unknown = set(model) - {"pool", "labels", "instruction", "timeout_ms", "on_failure", "max_tokens"}
    if unknown:
        raise ChainError(f"{at} has unknown keys: {sorted(unknown)}.")
    _remote_call(model, at, max_tokens_default=DEFAULT_LABEL_MAX_TOKENS)
    labels = model.get("labels")
    if not isinstance(labels, dict) or not labels:
        raise ChainError(f"{at}.labels must be a non-empty object of label -> pool name.")
    if len(labels) > MAX_LABELS:
        raise ChainError(f"{at}.labels has {len(labels)} labels; at most {MAX_LABELS}.")
    for label, pool in labels.items():
        if not LABEL.fullmatch(label):
            raise ChainError(
                f"{at}.labels: '{label}' is not a label (letters, digits, - and _, at most 32 characters)."
            )
        if not isinstance(pool, str) or not pool:
            raise ChainError(f"{at}.labels.{label} must be a pool name.")


def _classify(config: dict[str, Any], where: str) -> None:
    if "model" in config:
        _classify_model(config["model"], where)
        if "rules" not in config:
            return
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
        elif kind == "cache":
            _cache(config, where)
        elif kind == "remote":
            _remote(config, where)
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
    late = [s.name for s in stages[i + 1 :] if s.kind == "cache"]
    if late:
        raise ChainError(
            f"the cache stage '{late[0]}' comes after the generate step; it answers before generation: "
            "move it up."
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
            named.extend((s.name, rule["pool"]) for rule in s.config.get("rules") or [])
            model = s.config.get("model")
            if model:
                named.extend((s.name, pool) for pool in model["labels"].values())
    named.extend(cpu_pools_named(stages))
    return named


def cpu_pools_named(stages: list[StageSpec]) -> list[tuple[str, str]]:
    """(stage name, pool name) of every call to a CPU pool's engine (a remote stage, a model classifier):
    those pools must be of role cpu-postprocess."""
    named = [(s.name, s.config["pool"]) for s in stages if s.kind == "remote"]
    named.extend(
        (s.name, s.config["model"]["pool"]) for s in stages if s.kind == "classify" and s.config.get("model")
    )
    return named
