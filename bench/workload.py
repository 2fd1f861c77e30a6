"""What the load test sends: requests read from a JSON-lines file, or a seeded synthetic mix."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Words of the synthetic prompts: common English words, most of which are one token in the usual
# tokenizers, so a prompt of N words is close to N tokens.
_WORD_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but "
    "have an they you were her all she there would their we him been has when who will no more if "
    "out so up said what its about than into them can only other time new some could these two may "
    "first then do any like my now over such our man me even most made after also did many before "
    "must through back years where much your way well down should because each just those people how "
    "too little state good very make world"
)
_WORDS = _WORD_TEXT.split()


class WorkloadError(ValueError):
    """A workload file or option that cannot be used; the message names the line and the field."""


@dataclass(frozen=True)
class WorkItem:
    """One request of the workload: chat messages or a completion prompt, and its output budget."""

    max_tokens: int
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    prefix_group: str | None = None
    session_id: str | None = None

    def body(self, model: str) -> dict[str, Any]:
        """The request body for /v1/chat/completions (messages) or /v1/completions (prompt)."""
        out: dict[str, Any] = {"model": model, "max_tokens": self.max_tokens, "stream": True}
        out["stream_options"] = {"include_usage": True}
        if self.messages is not None:
            out["messages"] = self.messages
        else:
            out["prompt"] = self.prompt
        return out

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.messages is not None else "/v1/completions"


def _item_from(obj: Any, where: str) -> WorkItem:
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    messages, prompt = obj.get("messages"), obj.get("prompt")
    if (messages is None) == (prompt is None):
        raise WorkloadError(f"{where}: give exactly one of 'messages' (chat) or 'prompt' (completion)")
    if messages is not None:
        if not isinstance(messages, list) or not messages:
            raise WorkloadError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
                raise WorkloadError(f"{where}: messages[{i}] must be an object with 'role' and 'content'")
    if prompt is not None and (not isinstance(prompt, str) or not prompt):
        raise WorkloadError(f"{where}: 'prompt' must be a non-empty string")
    max_tokens = obj.get("max_tokens", 128)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise WorkloadError(f"{where}: 'max_tokens' must be a positive integer, got {max_tokens!r}")
    group, session = obj.get("prefix_group"), obj.get("session_id")
    for name, value in (("prefix_group", group), ("session_id", session)):
        if value is not None and not isinstance(value, str | int):
            raise WorkloadError(f"{where}: '{name}' must be a string or an integer")
    unknown = set(obj) - {"messages", "prompt", "max_tokens", "prefix_group", "session_id"}
    if unknown:
        raise WorkloadError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    return WorkItem(
        max_tokens=max_tokens,
        messages=messages,
        prompt=prompt,
        prefix_group=None if group is None else str(group),
        session_id=None if session is None else str(session),
    )


def parse_jsonl(lines: Iterable[str], source: str = "workload") -> list[WorkItem]:
    """Parse a JSON-lines workload; the first bad line stops it with its line number and the reason."""
    items = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source} line {number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        items.append(_item_from(obj, where))
    if not items:
        raise WorkloadError(f"{source}: no requests in the file")
    return items


def load_jsonl(path: Path) -> list[WorkItem]:
    try:
        with path.open(encoding="utf-8") as f:
            return parse_jsonl(f, source=str(path))
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read the workload file ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise WorkloadError(f"{path}: the workload file is not UTF-8 text") from None


@dataclass(frozen=True)
class SyntheticMix:
    """A seeded mix: short prompts with a share of long ones, optional shared system prompts."""

    requests: int = 200
    prompt_tokens: int = 256  # mean of the short prompts (log-normal around it)
    output_tokens: int = 128  # mean output budget (log-normal around it)
    long_share: float = 0.0  # fraction of requests with a long prompt
    long_prompt_tokens: int = 7000
    shared_prefixes: int = 0  # number of distinct shared system prompts (0: none)
    prefix_tokens: int = 1000
    sigma: float = 0.4  # spread of the log-normal lengths
    seed: int = 0
    chat: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        if self.requests < 1:
            raise WorkloadError("synthetic mix: requests must be at least 1")
        if not 0.0 <= self.long_share <= 1.0:
            raise WorkloadError(f"synthetic mix: long share must be between 0 and 1, got {self.long_share}")
        for name in ("prompt_tokens", "output_tokens", "long_prompt_tokens", "prefix_tokens"):
            if getattr(self, name) < 1:
                raise WorkloadError(f"synthetic mix: {name.replace('_', ' ')} must be at least 1")
        if self.shared_prefixes < 0:
            raise WorkloadError("synthetic mix: shared prefixes must be 0 or more")


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(max(1, n)))


def _lognormal(rng: random.Random, mean: int, sigma: float) -> int:
    # Log-normal with the given mean: mu = ln(mean) - sigma^2 / 2.
    import math

    return max(1, round(rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)))


def synthetic(mix: SyntheticMix) -> list[WorkItem]:
    """The mix's requests, the same for the same seed."""
    mix.check()
    rng = random.Random(mix.seed)
    prefixes = [
        _words(random.Random(mix.seed * 1000 + g), mix.prefix_tokens) for g in range(mix.shared_prefixes)
    ]
    items = []
    for i in range(mix.requests):
        is_long = rng.random() < mix.long_share
        n = _lognormal(rng, mix.long_prompt_tokens if is_long else mix.prompt_tokens, mix.sigma)
        out = _lognormal(rng, mix.output_tokens, mix.sigma)
        user = f"Request {i}: " + _words(rng, n)
        group = rng.randrange(mix.shared_prefixes) if mix.shared_prefixes else None
        if mix.chat:
            messages: list[dict[str, Any]] = []
            if group is not None:
                messages.append({"role": "system", "content": prefixes[group]})
            messages.append({"role": "user", "content": user})
            items.append(
                WorkItem(
                    max_tokens=out, messages=messages, prefix_group=None if group is None else str(group)
                )
            )
        else:
            prompt = (prefixes[group] + "\n\n" if group is not None else "") + user
            items.append(
                WorkItem(max_tokens=out, prompt=prompt, prefix_group=None if group is None else str(group))
            )
    return items
