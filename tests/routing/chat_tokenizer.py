"""A small Hugging Face tokenizer directory with a ChatML template, for counting tests.

Word-level, so every word is one token and the expected counts can be written down by hand: each
message costs `<|im_start|>`, its role and `<|im_end|>` (3 tokens); a conversation without a system
message gets the default system prompt `<|im_start|>system You are a helpful bot<|im_end|>` (8); the
generation prompt is `<|im_start|>assistant` (2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful bot<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|im_start|>", "<|im_end|>", "<s>", "</s>"]
WORDS = [
    *["system", "user", "assistant", "tool", "You", "are", "a", "helpful", "bot"],
    *["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"],
    *["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "lorem", "ipsum"],
]
MESSAGE_OVERHEAD = 3
DEFAULT_SYSTEM = 8
GENERATION_PROMPT = 2


def write_tokenizer_dir(directory: Path, chat_template: Any = CHATML, **config: Any) -> Path:
    """Write tokenizer.json and tokenizer_config.json into `directory`; returns the tokenizer.json path."""
    vocab = {"[UNK]": 0}
    for word in [*SPECIALS, *WORDS]:
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tokenizer.json"
    tok.save(str(path))
    settings = {"bos_token": "<s>", "eos_token": {"content": "</s>", "special": True}, **config}
    if chat_template is not None:
        settings["chat_template"] = chat_template
    (directory / "tokenizer_config.json").write_text(json.dumps(settings))
    return path
