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
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import gguf
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

    def render(self, messages: list[Any]) -> str:
        """The prompt text the engine builds for `messages` (with the generation prompt).

        When the engine adds the BOS token itself and the template also writes it, llama.cpp's chat
        handler keeps one; so does this (the leading BOS text is dropped, the engine adds the token).
        """
        text = chat_renderer(self.template, self.bos_token, self.eos_token)(messages)
        if self.add_bos and self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token) :]
        return text


def _field_value(reader: Any, name: str) -> Any:
    found = reader.get_field(name)
    return found.contents() if found is not None else None


@functools.lru_cache(maxsize=32)
def _read_gguf_chat_template(path: str, size: int, mtime_ns: int) -> ChatTemplate | None:
    reader = gguf.GGUFReader(path, "r")
    template = _field_value(reader, "tokenizer.chat_template")
    if not isinstance(template, str) or not template:
        return None
    tokens = reader.get_field("tokenizer.ggml.tokens")

    def token_text(key: str) -> str:
        index = _field_value(reader, key)
        if tokens is None or not isinstance(index, int) or not 0 <= index < len(tokens.data):
            return ""
        return bytes(tokens.parts[tokens.data[index]]).decode("utf-8", errors="replace")

    return ChatTemplate(
        template=template,
        bos_token=token_text("tokenizer.ggml.bos_token_id"),
        eos_token=token_text("tokenizer.ggml.eos_token_id"),
        add_bos=bool(_field_value(reader, "tokenizer.ggml.add_bos_token")),
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
