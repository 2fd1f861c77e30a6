"""Prompt token counts with the model version's own tokenizer, cached per version.

A `tokenizer.json` loads straight into `tokenizers`; a GGUF file's BPE vocabulary (`gpt2`-style, as
SmolLM2 and most llama.cpp models use) is rebuilt into a `tokenizers` BPE. When a version has neither,
the count is an estimate (about four characters per token) and is marked as such.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

log = logging.getLogger(__name__)

# Chat templates add a few tokens per message (role markers, separators); count them as OpenAI does.
PER_MESSAGE_OVERHEAD = 4


@dataclass(frozen=True, slots=True)
class TokenCount:
    tokens: int
    estimated: bool


def _field_strings(reader: Any, name: str) -> list[str]:
    field = reader.get_field(name)
    if field is None:
        return []
    return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]


def _gguf_tokenizer(path: str) -> Tokenizer | None:
    import gguf

    reader = gguf.GGUFReader(path)
    model_field = reader.get_field("tokenizer.ggml.model")
    if model_field is None:
        return None
    model_type = bytes(model_field.parts[model_field.data[0]]).decode()
    if model_type != "gpt2":
        # SentencePiece-style vocabularies need the scores and byte fallback; estimate rather than miscount.
        log.info("GGUF %s has a %r vocabulary; counting by estimate", path, model_type)
        return None
    tokens = _field_strings(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in _field_strings(reader, "tokenizer.ggml.merges")]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))  # type: ignore[arg-type]
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


@functools.lru_cache(maxsize=64)
def load_tokenizer(path: str | None) -> Tokenizer | None:
    """The tokenizer at `path` (tokenizer.json or .gguf), loaded once per path; None when unusable."""
    if not path:
        return None
    try:
        if path.endswith(".gguf"):
            return _gguf_tokenizer(path)
        return Tokenizer.from_file(path)
    except Exception as exc:  # a missing or corrupt file must not take the proxy down; estimate instead
        log.warning("tokenizer %s unusable (%s); counting by estimate", path, exc)
        return None


def prompt_text_parts(body: dict[str, Any], kind: str) -> list[str]:
    """The text pieces of a request that the engine will tokenize as prompt."""
    if kind == "chat":
        parts: list[str] = []
        for message in body.get("messages") or []:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts.extend(
                    p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
                )
        return parts
    prompt = body.get("prompt") if kind == "completion" else body.get("input")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list):
        return [p for p in prompt if isinstance(p, str)]
    return []


def count_prompt_tokens(parts: list[str], tokenizer: Tokenizer | None, n_messages: int = 0) -> TokenCount:
    overhead = PER_MESSAGE_OVERHEAD * n_messages
    if tokenizer is None:
        chars = sum(len(p) for p in parts)
        return TokenCount(tokens=max(1, (chars + 3) // 4) + overhead, estimated=True)
    if not parts:
        return TokenCount(tokens=overhead, estimated=False)
    encodings = tokenizer.encode_batch(parts, add_special_tokens=False)
    return TokenCount(tokens=sum(len(e.ids) for e in encodings) + overhead, estimated=False)
