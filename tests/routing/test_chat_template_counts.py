"""Chat prompts are counted with the chat template, reduced once to a fixed part and a part per role."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
import pytest
from tokenizers import Tokenizer

from routing.proxy.tokens import (
    PER_MESSAGE_OVERHEAD,
    chat_roles,
    count_prompt_tokens,
    load_tokenizer,
    prompt_text_parts,
)
from tests.routing.chat_tokenizer import (
    CHATML,
    DEFAULT_SYSTEM,
    GENERATION_PROMPT,
    MESSAGE_OVERHEAD,
    write_tokenizer_dir,
)

CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "the quick brown fox"}],
    [{"role": "system", "content": "You are a lazy dog"}, {"role": "user", "content": "lorem ipsum"}],
    [
        {"role": "system", "content": "bot"},
        {"role": "user", "content": "the fox"},
        {"role": "assistant", "content": "jumps over the lazy dog"},
        {"role": "user", "content": "quick quick"},
    ],
    [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "the dog"},
        {"role": "user", "content": "over lazy"},
        {"role": "assistant", "content": "brown"},
        {"role": "user", "content": "lorem ipsum lorem"},
    ],
]


def _engine_count(path: Path, template: str, messages: list[dict[str, Any]]) -> int:
    """What an engine would count: render the template (plainly, per request) and tokenize the text."""
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    text = env.from_string(template).render(messages=messages, add_generation_prompt=True)
    return len(Tokenizer.from_file(str(path)).encode(text, add_special_tokens=False))


def _count(path: Path, messages: list[dict[str, Any]]) -> Any:
    body = {"messages": messages}
    return count_prompt_tokens(prompt_text_parts(body, "chat"), load_tokenizer(str(path)), chat_roles(body))


def test_template_overhead_is_derived_per_role(tmp_path: Path) -> None:
    loaded = load_tokenizer(str(write_tokenizer_dir(tmp_path)))
    assert loaded is not None and loaded.chat is not None
    assert loaded.chat.base == DEFAULT_SYSTEM + GENERATION_PROMPT
    assert loaded.chat.per_role == {
        "user": MESSAGE_OVERHEAD,
        "assistant": MESSAGE_OVERHEAD,
        # A system message replaces the default one.
        "system": MESSAGE_OVERHEAD - DEFAULT_SYSTEM,
    }


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_count_equals_the_rendered_prompt(tmp_path: Path, messages: list[dict[str, Any]]) -> None:
    path = write_tokenizer_dir(tmp_path)
    counted = _count(path, messages)
    assert counted.tokens == _engine_count(path, CHATML, messages)
    assert not counted.estimated


def test_single_user_message_by_hand(tmp_path: Path) -> None:
    counted = _count(write_tokenizer_dir(tmp_path), [{"role": "user", "content": "the quick brown fox"}])
    assert counted.tokens == 4 + MESSAGE_OVERHEAD + DEFAULT_SYSTEM + GENERATION_PROMPT == 17


def test_named_templates_use_the_default_one(tmp_path: Path) -> None:
    named = [{"name": "tool_use", "template": "{{ raise_exception('not this one') }}"}]
    named.append({"name": "default", "template": CHATML})
    path = write_tokenizer_dir(tmp_path, chat_template=named)
    messages = CONVERSATIONS[2]
    assert _count(path, messages).tokens == _engine_count(path, CHATML, messages)


def test_bos_and_eos_from_the_config_reach_the_template(tmp_path: Path) -> None:
    template = "{{ bos_token }}" + CHATML.replace("<|im_end|>", "' + eos_token + '")
    path = write_tokenizer_dir(tmp_path, chat_template=template)
    messages = CONVERSATIONS[1]
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    text = env.from_string(template).render(
        messages=messages, add_generation_prompt=True, bos_token="<s>", eos_token="</s>"
    )
    assert "<s>" in text and "</s>" in text
    expected = len(Tokenizer.from_file(str(path)).encode(text, add_special_tokens=False))
    assert _count(path, messages).tokens == expected


def test_chat_template_jinja_file_wins_over_the_config(tmp_path: Path) -> None:
    path = write_tokenizer_dir(tmp_path, chat_template="{{ raise_exception('stale') }}")
    (tmp_path / "chat_template.jinja").write_text(CHATML)
    loaded = load_tokenizer(str(path))
    assert loaded is not None and loaded.chat is not None


def test_unknown_role_counts_as_user_and_is_marked(tmp_path: Path) -> None:
    path = write_tokenizer_dir(tmp_path)
    messages = [*CONVERSATIONS[0], {"role": "tool", "content": "dog"}]
    counted = _count(path, messages)
    assert counted.estimated
    assert counted.tokens == _engine_count(path, CHATML, messages)  # ChatML treats every role alike


def test_template_refusing_system_still_counts_user_turns(tmp_path: Path) -> None:
    template = (
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}" + CHATML
    )
    path = write_tokenizer_dir(tmp_path, chat_template=template)
    loaded = load_tokenizer(str(path))
    assert loaded is not None and loaded.chat is not None and "system" not in loaded.chat.per_role
    messages = CONVERSATIONS[3]
    counted = _count(path, messages)
    assert counted.tokens == _engine_count(path, CHATML, messages) and not counted.estimated


@pytest.mark.parametrize(
    "template",
    [
        "{% for m in messages %}{{ m['content'] }",  # does not compile
        "{{ raise_exception('no') }}",  # never renders
        # Adds tokens by position, not by role: cannot be reduced to a part per role.
        "{% for m in messages %}{{ 'the ' * loop.index }}{{ m['content'] }} {% endfor %}",
    ],
)
def test_unusable_template_falls_back_to_marked_estimate(tmp_path: Path, template: str) -> None:
    path = write_tokenizer_dir(tmp_path, chat_template=template)
    loaded = load_tokenizer(str(path))
    assert loaded is not None and loaded.chat is None
    counted = _count(path, CONVERSATIONS[1])
    # Contents by the tokenizer (7 words) plus the old per-message guess, marked as an estimate.
    assert counted.tokens == 7 + 2 * PER_MESSAGE_OVERHEAD and counted.estimated


def test_template_runs_sandboxed(tmp_path: Path) -> None:
    # A template is model-supplied code: reaching Python internals must fail, leaving an estimate.
    template = "{{ messages.__class__.__mro__[1].__subclasses__() }}" + CHATML
    loaded = load_tokenizer(str(write_tokenizer_dir(tmp_path, chat_template=template)))
    assert loaded is not None and loaded.chat is None


def test_no_template_is_a_marked_estimate(tmp_path: Path) -> None:
    path = write_tokenizer_dir(tmp_path, chat_template=None)
    counted = _count(path, CONVERSATIONS[0])
    assert counted.tokens == 4 + PER_MESSAGE_OVERHEAD and counted.estimated
    # Completions have no template: their count is exact.
    completion = count_prompt_tokens(["the quick brown fox"], load_tokenizer(str(path)))
    assert completion.tokens == 4 and not completion.estimated
