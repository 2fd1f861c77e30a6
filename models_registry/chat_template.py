"""A model's chat template: read from its GGUF file and rendered as the engines render it.

Two users: the proxy counts a chat request's prompt tokens as the engine will see them
(routing/proxy/tokens.py), and an evaluation run rebuilds, as text, the prompt a llama.cpp engine saw
for a chat request, so the candidate can score the reference's answer after exactly that prompt
(llama-cpp-python's server takes only text prompts; models_registry/evaluation/runner.py).

No Django here: the proxy imports it on its hot path's side.
"""

from __future__ import annotations

import functools
import json
import mmap
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent)


def chat_renderer(template: str, bos_token: str = "", eos_token: str = "") -> Callable[[list[Any]], str]:
    """A function rendering `messages` with the template as vLLM, transformers and llama-cpp-python do.

    Sandboxed (a template is model-supplied code), `trim_blocks`/`lstrip_blocks`, `raise_exception`,
    `strftime_now`, bos/eos tokens and `add_generation_prompt=True`.
    """
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    compiled = env.from_string(template)

    def render(messages: list[Any]) -> str:
        return compiled.render(
            messages=messages, bos_token=bos_token, eos_token=eos_token, add_generation_prompt=True
        )

    return render


@dataclass(frozen=True)
class ChatTemplate:
    """A GGUF's `tokenizer.chat_template` with the token texts it is rendered with."""

    template: str
    bos_token: str = ""
    eos_token: str = ""
    # tokenizer.ggml.add_bos_token: the engine puts the BOS token before the prompt itself.
    add_bos: bool = False
    # len(tokenizer.ggml.tokens): the k that lists a whole distribution (0 when unknown).
    vocab_size: int = 0

    def render(self, messages: list[Any]) -> str:
        """The prompt text the engine builds for `messages` (with the generation prompt).

        When the engine adds the BOS token itself and the template also writes it, llama.cpp's chat
        handler keeps one; so does this (the leading BOS text is dropped, the engine adds the token).
        """
        text = chat_renderer(self.template, self.bos_token, self.eos_token)(messages)
        if self.add_bos and self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token) :]
        return text


# GGUF value types (gguf's GGUFValueType): fixed sizes by struct code; 8 is a string, 9 an array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_WANTED = (
    "tokenizer.chat_template",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.add_bos_token",
)


def _read_header(path: str) -> tuple[dict[str, Any], list[str]]:
    """The wanted metadata values and the token list of a GGUF file, reading the header only.

    gguf.GGUFReader would do, but it builds an array per element of every field and maps the tensor
    table: over ten seconds for SmolLM2's 49k-token vocabulary on a busy machine, where this takes well
    under one. Format: magic, version, tensor count, KV count, then (key, type, value) triples.
    """
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        return _parse_header(mapped)


def _parse_header(view: mmap.mmap) -> tuple[dict[str, Any], list[str]]:
    offset = 0

    def take(fmt: str) -> Any:
        nonlocal offset
        (value,) = struct.unpack_from("<" + fmt, view, offset)
        offset += struct.calcsize("<" + fmt)
        return value

    def string() -> str:
        nonlocal offset
        length = take("Q")
        text = view[offset : offset + length].decode("utf-8", errors="replace")
        offset += length
        return text

    def value(kind: int, keep: bool) -> Any:
        nonlocal offset
        if kind in _SCALARS:
            return take(_SCALARS[kind])
        if kind == _STRING:
            return string()
        if kind != _ARRAY:
            raise ValueError(f"unknown GGUF value type {kind}")
        inner, count = take("I"), take("Q")
        if inner in _SCALARS and not keep:
            offset += count * struct.calcsize("<" + _SCALARS[inner])
            return None
        items = [value(inner, keep) for _ in range(count)]
        return items if keep else None

    if view[:4] != b"GGUF":
        raise ValueError("not a GGUF file")
    offset = 4
    version = take("I")
    if version < 2:
        raise ValueError(f"GGUF version {version} is not supported")
    take("Q")  # tensor count
    found: dict[str, Any] = {}
    tokens: list[str] = []
    for _ in range(take("Q")):
        key, kind = string(), take("I")
        if key == "tokenizer.ggml.tokens":
            tokens = value(kind, keep=True)
        else:
            got = value(kind, keep=key in _WANTED)
            if key in _WANTED:
                found[key] = got
    return found, tokens


@functools.lru_cache(maxsize=32)
def _read_gguf_chat_template(path: str, size: int, mtime_ns: int) -> ChatTemplate | None:
    found, tokens = _read_header(path)
    template = found.get("tokenizer.chat_template")
    if not isinstance(template, str) or not template:
        return None

    def token_text(key: str) -> str:
        index = found.get(key)
        return tokens[index] if isinstance(index, int) and 0 <= index < len(tokens) else ""

    return ChatTemplate(
        template=template,
        bos_token=token_text("tokenizer.ggml.bos_token_id"),
        eos_token=token_text("tokenizer.ggml.eos_token_id"),
        add_bos=bool(found.get("tokenizer.ggml.add_bos_token")),
        vocab_size=len(tokens),
    )


def gguf_chat_template(path: str) -> ChatTemplate | None:
    """The chat template a GGUF file carries, or None (no template, or not a readable GGUF file).

    Cached per file version (size and mtime), so a run asks once however many cases it has.
    """
    try:
        stat = os.stat(path)
        return _read_gguf_chat_template(path, stat.st_size, stat.st_mtime_ns)
    except Exception:  # a missing or corrupt file: the caller says why it cannot use a template
        return None
