"""Prompt token counts with the model version's own tokenizer and chat template, cached per version.

A `tokenizer.json` loads straight into `tokenizers`; a GGUF file's BPE vocabulary (`gpt2`-style, as
SmolLM2 and most llama.cpp models use) is rebuilt into a `tokenizers` BPE. When a version has neither,
the count is an estimate (about four characters per token) and is marked as such.

Chat requests are counted as the engine will see them: the message contents plus what the model's chat
template adds around them. Rendering the template per request would cost more than the whole proxy
spends on one, so once per version it is rendered (sandboxed, as vLLM and transformers render it) for a
few probe conversations, and the tokens it adds are reduced to a fixed part and a part per message role
(`ChatOverhead`). A request then costs its contents' tokens plus a lookup per message. A template that
cannot be rendered, or whose additions are not a fixed part plus a part per role, leaves chat counts at
the contents plus `PER_MESSAGE_OVERHEAD` per message, marked as an estimate.

Simulated models without a tokenizer file are counted with the simulator's own documented rule
(`vllm_sim.text`), which is what their engines report as `usage.prompt_tokens`: exact, not estimated.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from models_registry.chat_template import chat_renderer
from routing.proxy.scorers import PREFIX_TOKENS
from vllm_sim import text as sim_text

log = logging.getLogger(__name__)

# Without a usable chat template: a few tokens per message (role markers, separators), as OpenAI counts.
PER_MESSAGE_OVERHEAD = 4
# GGUF token types (llama.cpp's llama_token_type) that engines match as whole special tokens.
_GGUF_CONTROL = 3
_GGUF_USER_DEFINED = 4
# Probe contents: plain words that tokenize the same alone and next to template text.
_PROBE_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")


@dataclass(frozen=True, slots=True)
class TokenCount:
    tokens: int
    estimated: bool
    # The prompt's first PREFIX_TOKENS content token ids (prefix-affinity routing reuses them);
    # None when there is no tokenizer.
    leading_ids: list[int] | None = None


@dataclass(frozen=True, slots=True)
class ChatOverhead:
    """Tokens a chat template adds around the message contents: `base` once, `per_role[role]` per message.

    `base` includes the generation prompt and any default system prompt the template adds when the
    conversation has no system message (`per_role["system"]` takes that back out again).
    """

    base: int
    per_role: Mapping[str, int]

    def tokens(self, roles: Sequence[str]) -> tuple[int, bool]:
        """(overhead for these roles, whether it is exact); a role the probes did not cover counts as user."""
        total = self.base
        exact = True
        per_role = self.per_role
        for role in roles:
            extra = per_role.get(role)
            if extra is None:
                extra = per_role["user"]
                exact = False
            total += extra
        return total, exact


@dataclass(frozen=True, slots=True)
class PromptTokenizer:
    """A version's tokenizer and, when its chat template could be reduced, that template's overhead."""

    tokenizer: Tokenizer
    chat: ChatOverhead | None = None


# ---- chat templates ---------------------------------------------------------------------------------


def derive_chat_overhead(
    tokenizer: Tokenizer, template: str, bos_token: str = "", eos_token: str = ""
) -> ChatOverhead | None:
    """The template's additions as a fixed part plus a part per role, or None when it has no such form.

    Probes: [user], [user, assistant], [user, assistant, user] and [system, user]; checked against two
    longer conversations, so a template whose additions depend on more than the roles is not trusted.
    """
    try:
        render = chat_renderer(template, bos_token, eos_token)
    except Exception as exc:  # a syntax error in model-supplied text must not take the proxy down
        log.warning("chat template does not compile (%s); chat counts are estimates", exc)
        return None

    def added(roles: Sequence[str]) -> int:
        messages = [{"role": r, "content": w} for r, w in zip(roles, _PROBE_WORDS, strict=False)]
        text = render(messages)
        if any(m["content"] not in text for m in messages):
            raise ValueError("the template drops message contents")
        contents = tokenizer.encode_batch([m["content"] for m in messages], add_special_tokens=False)
        return len(tokenizer.encode(text, add_special_tokens=False)) - sum(len(e) for e in contents)

    try:
        one = added(["user"])
        user_assistant = added(["user", "assistant"])
        # Only user + assistant matters for conversations that alternate and end on the user, so the
        # split between them cannot go wrong where it counts even if a template treats a last assistant
        # message specially.
        assistant = user_assistant - one
        user = added(["user", "assistant", "user"]) - user_assistant
        per_role = {"user": user, "assistant": assistant}
        checks: list[list[str]] = [["user", "assistant", "user", "assistant", "user"]]
    except Exception as exc:
        log.warning("chat template does not render probe conversations (%s); chat counts are estimates", exc)
        return None
    try:
        per_role["system"] = added(["system", "user"]) - one
        checks.append(["system", "user", "assistant", "user"])
    except Exception as exc:  # some templates refuse system messages; so will the engine
        log.info("chat template refuses a system message (%s)", exc)
    overhead = ChatOverhead(base=one - user, per_role=per_role)
    try:
        for roles in checks:
            if added(roles) != overhead.tokens(roles)[0]:
                log.warning("chat template adds tokens that depend on more than roles; counts are estimates")
                return None
    except Exception as exc:
        log.warning("chat template fails a check conversation (%s); chat counts are estimates", exc)
        return None
    return overhead


# ---- loading ----------------------------------------------------------------------------------------


def _field_strings(reader: Any, name: str) -> list[str]:
    field = reader.get_field(name)
    if field is None:
        return []
    return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]


def _field_int(reader: Any, name: str) -> int | None:
    field = reader.get_field(name)
    if field is None:
        return None
    return int(field.parts[field.data[0]][0])


def _gguf_tokenizer(path: str) -> PromptTokenizer | None:
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
    # A rendered chat template holds control tokens (`<|im_start|>`), which engines match whole.
    types_field = reader.get_field("tokenizer.ggml.token_type")
    if types_field is not None:
        types = [int(types_field.parts[i][0]) for i in types_field.data]
        special = [
            AddedToken(tokens[i], special=True, normalized=False)
            for i, t in enumerate(types)
            if t in (_GGUF_CONTROL, _GGUF_USER_DEFINED)
        ]
        tok.add_special_tokens(special)
    chat = None
    template = _field_strings(reader, "tokenizer.chat_template")
    if template:
        bos_id = _field_int(reader, "tokenizer.ggml.bos_token_id")
        eos_id = _field_int(reader, "tokenizer.ggml.eos_token_id")
        bos = tokens[bos_id] if bos_id is not None and bos_id < len(tokens) else ""
        eos = tokens[eos_id] if eos_id is not None and eos_id < len(tokens) else ""
        chat = derive_chat_overhead(tok, template[0], bos, eos)
    return PromptTokenizer(tok, chat)


def _token_text(value: Any) -> str:
    # tokenizer_config.json writes special tokens as strings or as serialized AddedTokens.
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def hf_chat_template(config: dict[str, Any], directory: Path) -> str | None:
    """The default chat template of a Hugging Face tokenizer directory, as transformers picks it."""
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text()
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the one called "default", else none
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) and template else None


def _hf_tokenizer(path: str) -> PromptTokenizer:
    tok = Tokenizer.from_file(path)
    directory = Path(path).parent
    config_path = directory / "tokenizer_config.json"
    config: dict[str, Any] = {}
    if config_path.is_file():
        loaded = json.loads(config_path.read_text())
        config = loaded if isinstance(loaded, dict) else {}
    template = hf_chat_template(config, directory)
    chat = None
    if template is not None:
        bos, eos = _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))
        chat = derive_chat_overhead(tok, template, bos, eos)
    return PromptTokenizer(tok, chat)


@functools.lru_cache(maxsize=64)
def load_tokenizer(path: str | None) -> PromptTokenizer | None:
    """The tokenizer and chat overhead at `path` (tokenizer.json or .gguf), loaded once; None if unusable."""
    if not path:
        return None
    try:
        loaded = _gguf_tokenizer(path) if path.endswith(".gguf") else _hf_tokenizer(path)
    except Exception as exc:  # a missing or corrupt file must not take the proxy down; estimate instead
        log.warning("tokenizer %s unusable (%s); counting by estimate", path, exc)
        return None
    if loaded is not None:
        log.info("tokenizer %s loaded; chat template overhead %s", path, loaded.chat)
    return loaded


# ---- per request --------------------------------------------------------------------------------------


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


def chat_roles(body: dict[str, Any]) -> list[str]:
    """The role of every message of a (validated) chat request, in order."""
    return [m["role"] for m in body["messages"]]


def count_prompt_tokens(
    parts: list[str], tokenizer: PromptTokenizer | None, roles: Sequence[str] | None = None
) -> TokenCount:
    """Prompt tokens of `parts`, plus the chat template's overhead for `roles` when it is a chat request.

    Exact when the version's tokenizer is known and, for chat, its template was reduced and every role
    was among the probed ones; otherwise marked estimated.
    """
    if tokenizer is None:
        chars = sum(len(p) for p in parts)
        return TokenCount(
            tokens=max(1, (chars + 3) // 4) + PER_MESSAGE_OVERHEAD * len(roles or ()), estimated=True
        )
    overhead, exact = 0, True
    if roles is not None:
        if tokenizer.chat is None:
            overhead, exact = PER_MESSAGE_OVERHEAD * len(roles), False
        else:
            overhead, exact = tokenizer.chat.tokens(roles)
    if not parts:
        return TokenCount(tokens=overhead, estimated=not exact, leading_ids=[])
    encodings = tokenizer.tokenizer.encode_batch(parts, add_special_tokens=False)
    leading: list[int] = []
    for e in encodings:
        leading.extend(e.ids[: PREFIX_TOKENS - len(leading)])
        if len(leading) >= PREFIX_TOKENS:
            break
    return TokenCount(
        tokens=sum(len(e) for e in encodings) + overhead, estimated=not exact, leading_ids=leading
    )


def count_sim_rule(body: dict[str, Any], kind: str) -> TokenCount:
    """Prompt tokens of a (validated) request under the simulator's built-in rule, as its engine counts.

    Chat: the Llama-3 style rendering the simulator applies, with `add_generation_prompt`; completion:
    BOS plus each prompt. Exact; no token ids (prefix affinity falls back to the text).
    """
    if kind == "chat":
        tokens = sim_text.chat_prompt_tokens(body["messages"], _lax_bool(body.get("add_generation_prompt")))
    else:
        prompt = body.get("prompt") if kind == "completion" else body.get("input")
        prompts = [prompt] if isinstance(prompt, str) else prompt if isinstance(prompt, list) else []
        tokens = sum(sim_text.completion_prompt_tokens(p) for p in prompts if isinstance(p, str))
    return TokenCount(tokens=max(1, tokens), estimated=False)


def _lax_bool(value: Any, default: bool = True) -> bool:
    """A boolean field as pydantic's lax mode (and so the engine) reads it; anything else is the default."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no", "on", "off"):
        return value.lower() in ("true", "1", "yes", "on")
    return default
