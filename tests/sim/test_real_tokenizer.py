"""With --tokenizer pointing at a Hugging Face tokenizer.json, prompt lengths come from that tokenizer,
as vLLM's come from the model's own (so usage agrees with a proxy counting with the same file)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

from tests.sim.conftest import MODEL, SimFactory
from tests.sim.http import call_json

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "simulated engines answer like vLLM does",
    "tokenizers split text into pieces of different sizes",
] * 20


def build_tokenizer(path: Path) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=120, special_tokens=["[UNK]", "<s>"]))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(str(path))
    return tok


def test_prompt_tokens_come_from_the_given_tokenizer(sim_factory: SimFactory, tmp_path: Path) -> None:
    tok = build_tokenizer(tmp_path / "tokenizer.json")
    sim = sim_factory("--max-model-len", "4096", "--tokenizer", str(tmp_path))
    prompt = "the lazy fox answers like engines do"
    expected = tok.encode(prompt).ids  # with the post-processor's <s>, as add_special_tokens=True
    _, t = call_json(sim.base_url + "/tokenize", {"prompt": prompt})
    assert t["tokens"] == expected
    _, r = call_json(sim.base_url + "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1})
    assert r["usage"]["prompt_tokens"] == len(expected)
    # The built-in tokenizer would have counted differently.
    _, builtin = call_json(sim_factory("--max-model-len", "4096").base_url + "/tokenize", {"prompt": prompt})
    assert builtin["count"] != len(expected)


def test_an_unusable_tokenizer_falls_back_to_the_builtin_one(sim_factory: SimFactory, tmp_path: Path) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    sim = sim_factory("--max-model-len", "4096", "--tokenizer", str(bad))
    status, t = call_json(sim.base_url + "/tokenize", {"prompt": "hello world"})
    assert status == 200 and t["count"] == 3
    assert "using the built-in one" in sim.log_text()
