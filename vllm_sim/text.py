"""Tokens and text of the simulator: a deterministic word-piece tokenizer and a deterministic "model".

The tokenizer is not the model's real one (that would need the checkpoint's tokenizer files, which a
machine without the model does not have); it splits text into word pieces of at most eight letters,
digit groups of up to three, single punctuation marks and whitespace runs, which lands within ~20% of a
BPE tokenizer's count on English text. It is used everywhere a length matters (usage, /tokenize,
max_model_len checks, KV blocks), so all of them agree with each other.

It is also the documented counting rule for simulated models that have no tokenizer file: the proxy
counts their prompts with `chat_prompt_tokens` / `completion_prompt_tokens` below (routing imports this
module; this module imports nothing of the console), so the count it routes by is the count the
simulator reports as `usage.prompt_tokens`:

- a completion prompt is `<|begin_of_text|>` + the prompt;
- a chat prompt is `render_chat(messages)`: `<|begin_of_text|>`, then per message
  `<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>`, then the assistant header
  (unless `add_generation_prompt` is false); a content given as parts is their texts joined by "\n",
  a null content is empty;
- the five Llama-3 special tokens count one each; the rest is split by `_PIECE_RE`, one token a piece.

Output tokens come from a small English vocabulary (VOCAB); which ones is the simulated model's business
(vllm_sim/model.py): the same prompt with the same seed (or with temperature 0) always yields the same
text.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import zlib
from collections.abc import Mapping, Sequence

from tokenizers import Tokenizer

MASK64 = (1 << 64) - 1

# Llama-3 special tokens: the ids are the real ones, so /tokenize output looks familiar.
SPECIAL_TOKENS = {
    "<|begin_of_text|>": 128000,
    "<|end_of_text|>": 128001,
    "<|start_header_id|>": 128006,
    "<|end_header_id|>": 128007,
    "<|eot_id|>": 128009,
}
BOS = "<|begin_of_text|>"
_SPECIAL_RE = re.compile("(" + "|".join(re.escape(t) for t in SPECIAL_TOKENS) + ")")
_PIECE_RE = re.compile(r"'(?:s|t|re|ve|m|ll|d)| ?[A-Za-z]{1,8}| ?\d{1,3}| ?[^\sA-Za-z\d]|\s+(?!\S)|\s+")

_WORDS_TEXT = (
    "the of and to in is that it was for on are as with his they at be this from have or by one had not "
    "but what all were when we there can an your which their said if do will each about how up out them "
    "then she many some so these would other into has more her two like him see time could no make than "
    "first been its who now people my made over did down only way find use may water long little very "
    "after words called just where most know get through back much before go good new write our used me "
    "man too any day same right look think also around another came come work three word must because "
    "does part even place well such here take why things help put years different away again off went old "
    "number great tell men say small every found still between name should home big give air line set own "
    "under read last never us left end along while might next sound below saw something thought both few "
    "those always looked show large often together asked house world going want school important until "
    "form food keep children feet land side without boy once animals life enough took sometimes four head "
    "above kind began almost live page got earth need far hand high year mother light parts country father "
    "let night following picture being study second eyes soon times story boys since white days ever paper "
    "hard near sentence better best across during today others however sure means knew try told young "
    "model server request token cache memory latency batch engine queue prefix stream"
)
_WORDS = _WORDS_TEXT.split()
# Output vocabulary: words with a leading space, a few punctuation marks and a newline.
VOCAB: tuple[str, ...] = tuple([" " + w for w in _WORDS] + [".", ",", "\n"])
VOCAB_IDS: dict[str, int] = {piece: i + 100 for i, piece in enumerate(VOCAB)}
_ID_TO_PIECE: dict[int, str] = {v: k for k, v in VOCAB_IDS.items()}
_ID_TO_PIECE.update({v: k for k, v in SPECIAL_TOKENS.items()})
_LEARNED_CAP = 200_000
VOCAB_SIZE = 128256


def piece_id(piece: str) -> int:
    """Stable id of one word piece (the output vocabulary keeps fixed ids so it round-trips)."""
    known = VOCAB_IDS.get(piece)
    if known is not None:
        return known
    tid = 1000 + zlib.crc32(piece.encode()) % 127000
    if len(_ID_TO_PIECE) < _LEARNED_CAP:
        _ID_TO_PIECE.setdefault(tid, piece)
    return tid


def tokenize(text: str) -> list[int]:
    """Token ids of text; Llama-3 special tokens in the text count as one token each."""
    ids: list[int] = []
    for part in _SPECIAL_RE.split(text):
        if not part:
            continue
        special = SPECIAL_TOKENS.get(part)
        if special is not None:
            ids.append(special)
        else:
            ids.extend(piece_id(p) for p in _PIECE_RE.findall(part))
    return ids


def token_strs(text: str) -> list[str]:
    """The pieces behind tokenize(text), for /tokenize's return_token_strs."""
    out: list[str] = []
    for part in _SPECIAL_RE.split(text):
        if part in SPECIAL_TOKENS:
            out.append(part)
        elif part:
            out.extend(_PIECE_RE.findall(part))
    return out


def detokenize(ids: list[int]) -> str:
    """Text of token ids this process has produced or seen; unseen ids become empty strings."""
    return "".join(_ID_TO_PIECE.get(i, "") for i in ids)


def count_tokens(text: str) -> int:
    """len(tokenize(text)) without building the ids: what the proxy needs to route by."""
    total = 0
    for part in _SPECIAL_RE.split(text):
        if part in SPECIAL_TOKENS:
            total += 1
        elif part:
            total += len(_PIECE_RE.findall(part))
    return total


def content_text(content: object) -> str:
    """The text of one message's content: a string, text parts joined by newlines, or "" for null."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def chat_prompt_tokens(messages: Sequence[Mapping[str, object]], add_generation_prompt: bool = True) -> int:
    """Prompt tokens of a chat request under the built-in rule (what the simulator reports as usage)."""
    rendered = render_chat(
        [{"role": str(m.get("role")), "content": content_text(m.get("content"))} for m in messages],
        add_generation_prompt,
    )
    return count_tokens(rendered)


def completion_prompt_tokens(prompt: str) -> int:
    """Prompt tokens of one completion prompt under the built-in rule (BOS + prompt)."""
    return count_tokens(BOS + prompt)


def render_chat(messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """Llama-3 style chat template: the text whose tokens are the prompt of a chat request."""
    parts = [BOS]
    for m in messages:
        parts.append(f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>")
    if add_generation_prompt:
        parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(parts)


def mix64(x: int) -> int:
    """splitmix64 finaliser: a cheap, well-spread hash of one integer."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def request_key(prompt_ids: list[int], seed: object) -> int:
    """64-bit key of (prompt, seed) from which every output token of the request is derived; `seed` is
    anything with a stable repr (an int, a tuple, a marker string)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(repr(seed).encode())
    h.update(b"\0")
    h.update(",".join(map(str, prompt_ids)).encode())
    return int.from_bytes(h.digest(), "little")


class PromptTokenizer:
    """Turns prompt text into token ids for every length the simulator checks or reports.

    By default the built-in word-piece tokenizer above. When the deployment points `--tokenizer` (or the
    model argument) at a Hugging Face `tokenizer.json`, or a directory holding one, that tokenizer is
    used through `tokenizers`, so usage counts agree with the model's real tokenizer (and with a proxy
    that counts with it).
    """

    def __init__(self, hf: Tokenizer | None = None, source: str = "builtin") -> None:
        self.hf = hf
        self.source = source
        if hf is not None:
            vocab = hf.get_vocab(with_added_tokens=True)
            self.max_token_id = max(vocab.values(), default=0)
            # vLLM's tokenizer.max_chars_per_token: the longest vocabulary entry.
            self.max_chars_per_token = max((len(t) for t in vocab), default=1)
        else:
            self.max_token_id = VOCAB_SIZE - 1
            # The longest built-in piece: a special token (a word piece is at most 9 characters).
            self.max_chars_per_token = max(len(t) for t in SPECIAL_TOKENS)

    def encode_prompt(self, prompt: str, add_special_tokens: bool = True) -> list[int]:
        """A completion prompt: the tokenizer adds its BOS as vLLM's does (add_special_tokens=True)."""
        if self.hf is not None:
            return list(self.hf.encode(prompt, add_special_tokens=add_special_tokens).ids)
        return tokenize(BOS + prompt if add_special_tokens else prompt)

    def encode_rendered(self, rendered: str) -> list[int]:
        """A chat prompt already rendered by the template (which wrote its own special tokens)."""
        if self.hf is not None:
            return list(self.hf.encode(rendered, add_special_tokens=False).ids)
        return tokenize(rendered)

    def pieces(self, ids_text: str, add_special_tokens: bool = True) -> list[str]:
        if self.hf is not None:
            enc = self.hf.encode(ids_text, add_special_tokens=add_special_tokens)
            return list(enc.tokens)
        return token_strs(BOS + ids_text if add_special_tokens else ids_text)

    def decode(self, ids: list[int]) -> str:
        if self.hf is not None:
            return str(self.hf.decode(ids, skip_special_tokens=False))
        return detokenize(ids)


def config_vocab_size(model: str | None) -> int | None:
    """`vocab_size` of a model directory's config.json (a multimodal model's `text_config` holds it), as
    vLLM's ModelConfig.get_vocab_size reads it from the Hugging Face config; None without one."""
    if not model or not os.path.isdir(model):
        return None
    try:
        with open(os.path.join(model, "config.json"), encoding="utf-8") as fh:
            config = json.load(fh)
    except (OSError, ValueError):
        return None
    for holder in (config, config.get("text_config") or {}):
        size = holder.get("vocab_size") if isinstance(holder, dict) else None
        if isinstance(size, int) and size > 0:
            return size
    return None


def load_prompt_tokenizer(*candidates: str | None) -> PromptTokenizer:
    """The first usable tokenizer.json among the candidates (file or directory), else the built-in one."""
    for path in candidates:
        if not path:
            continue
        file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        if not (file.endswith(".json") and os.path.isfile(file)):
            continue
        try:
            return PromptTokenizer(Tokenizer.from_file(file), file)
        except Exception as exc:  # a broken file must not stop the engine; fall back and say so
            logging.getLogger("vllm_sim").warning(
                "tokenizer %s unusable (%s); using the built-in one", file, exc
            )
    return PromptTokenizer()
