"""The workload parser: good lines become requests; the first bad line is refused with its number."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.workload import SyntheticMix, WorkloadError, load_jsonl, parse_jsonl, synthetic


def test_chat_and_completion_lines() -> None:
    lines = [
        json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "session_id": "s1"}),
        "",
        json.dumps({"prompt": "Once upon", "max_tokens": 4, "prefix_group": 3}),
    ]
    chat, completion = parse_jsonl(lines)
    assert chat.path == "/v1/chat/completions" and chat.session_id == "s1"
    assert chat.body("m")["messages"][0]["content"] == "hi"
    assert completion.path == "/v1/completions" and completion.prefix_group == "3"
    assert completion.body("m") == {
        "model": "m",
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
        "prompt": "Once upon",
    }


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ("{not json", "not valid JSON"),
        ('{"max_tokens": 3}', "exactly one of 'messages'"),
        ('{"prompt": "x", "messages": [{"role": "user", "content": "y"}]}', "exactly one of"),
        ('{"prompt": "x", "max_tokens": 0}', "'max_tokens' must be a positive integer"),
        ('{"prompt": "x", "max_tokens": "5"}', "'max_tokens' must be a positive integer"),
        ('{"messages": [{"content": "no role"}]}', "messages[0] must be an object with 'role'"),
        ('{"prompt": "x", "temperature": 0}', "unknown field(s) temperature"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_a_bad_line_is_refused_with_its_line_number(bad: str, reason: str) -> None:
    lines = ['{"prompt": "fine"}', "", bad, '{"prompt": "never read"}']
    with pytest.raises(WorkloadError) as err:
        parse_jsonl(lines, source="w.jsonl")
    assert str(err.value).startswith("w.jsonl line 3: ")
    assert reason in str(err.value)


def test_an_empty_or_unreadable_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(WorkloadError, match="no requests"):
        load_jsonl(empty)
    with pytest.raises(WorkloadError, match="cannot read"):
        load_jsonl(tmp_path / "missing.jsonl")


def test_the_synthetic_mix_is_seeded_and_has_its_shares() -> None:
    mix = SyntheticMix(
        requests=400, prompt_tokens=100, long_share=0.25, long_prompt_tokens=2000, shared_prefixes=3
    )
    a, b = synthetic(mix), synthetic(mix)
    assert a == b
    assert synthetic(SyntheticMix(requests=400, seed=1)) != synthetic(SyntheticMix(requests=400, seed=0))
    lengths = [len(i.messages[-1]["content"].split()) for i in a if i.messages]
    long = sum(1 for n in lengths if n > 700)
    assert 70 <= long <= 130  # 25% of 400, binomial spread
    assert {i.prefix_group for i in a} == {"0", "1", "2"}
    systems = {i.messages[0]["content"] for i in a if i.messages}
    assert len(systems) == 3  # one shared system prompt per group


def test_bad_synthetic_options() -> None:
    with pytest.raises(WorkloadError, match="long share"):
        synthetic(SyntheticMix(long_share=1.5))
