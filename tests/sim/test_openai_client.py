"""The official openai client talks to the simulator as it would to vLLM."""

from __future__ import annotations

import openai
import pytest

from tests.sim.conftest import API_KEY, MODEL
from vllm_sim.testing import SimHandle


def client(sim: SimHandle, key: str = "EMPTY") -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.openai_base_url, api_key=key, max_retries=0, timeout=30)


def test_models_lists_every_served_name(sim: SimHandle) -> None:
    ids = [m.id for m in client(sim).models.list().data]
    assert ids == [MODEL, "llama-8b"]


def test_chat_completion_non_streaming(sim: SimHandle) -> None:
    r = client(sim).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hello"}],
        max_tokens=12,
        extra_body={"ignore_eos": True},
    )
    assert r.object == "chat.completion"
    assert r.id.startswith("chatcmpl-")
    assert r.model == MODEL
    choice = r.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert r.usage is not None
    assert r.usage.completion_tokens == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12


def test_second_served_name_is_accepted_and_answered_with_the_first(sim: SimHandle) -> None:
    r = client(sim).chat.completions.create(
        model="llama-8b", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    # vLLM's responses carry the first --served-model-name, whichever alias was requested.
    assert r.model == MODEL


def test_chat_streaming_with_usage(sim: SimHandle) -> None:
    stream = client(sim).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count to five"}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert len(usage_chunks) == 1 and usage_chunks[0] is chunks[-1]
    assert usage_chunks[0].choices == []
    assert usage_chunks[0].usage is not None and usage_chunks[0].usage.completion_tokens == 8
    # The streamed text is the text a non-streaming greedy call returns for the same prompt.
    full = client(sim).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count to five"}],
        max_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    stream_greedy = client(sim).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count to five"}],
        max_tokens=8,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    assert (
        "".join(c.choices[0].delta.content or "" for c in stream_greedy if c.choices)
        == full.choices[0].message.content
    )
    assert text


def test_completions_streaming_and_not(sim: SimHandle) -> None:
    c = client(sim)
    r = c.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=5, extra_body={"ignore_eos": True}
    )
    assert r.object == "text_completion"
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 5
    pieces = list(
        c.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=5, stream=True, extra_body={"ignore_eos": True}
        )
    )
    assert pieces[-1].choices[0].finish_reason == "length"
    assert "".join(p.choices[0].text for p in pieces)


def test_chat_logprobs_and_top_logprobs(sim: SimHandle) -> None:
    r = client(sim).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    lp = r.choices[0].logprobs
    assert lp is not None and lp.content is not None and len(lp.content) == 4
    assert "".join(t.token for t in lp.content) == r.choices[0].message.content
    for tok in lp.content:
        assert tok.logprob <= 0.0
        assert len(tok.top_logprobs) == 3
        # As in vLLM: the sampled token comes first, then the most likely ones by rank.
        assert (tok.top_logprobs[0].token, tok.top_logprobs[0].logprob) == (tok.token, tok.logprob)
        assert tok.top_logprobs[1].logprob >= tok.top_logprobs[2].logprob


def test_completion_logprobs(sim: SimHandle) -> None:
    r = client(sim).completions.create(
        model=MODEL, prompt="The sky is", max_tokens=3, logprobs=2, extra_body={"ignore_eos": True}
    )
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and len(lp.tokens) == 3
    assert lp.top_logprobs is not None and lp.token_logprobs is not None
    # The sampled token first, then the top 2 (one fewer when the sampled token is one of them).
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert next(iter(top.items())) == (token, logprob)
        assert len(top) in (2, 3)


def test_api_key_enforced_for_openai_client(keyed_sim: SimHandle) -> None:
    with pytest.raises(openai.AuthenticationError):
        client(keyed_sim, "wrong-key").models.list()
    assert [m.id for m in client(keyed_sim, API_KEY).models.list().data] == [MODEL]


def test_unknown_model_is_not_found(sim: SimHandle) -> None:
    with pytest.raises(openai.NotFoundError) as exc:
        client(sim).chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x"}])
    assert exc.value.status_code == 404


def test_streamed_logprobs_cover_every_token(sim: SimHandle) -> None:
    stream = client(sim).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=6,
        logprobs=True,
        top_logprobs=2,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    tokens = []
    text = ""
    for chunk in stream:
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
            tokens += [t.token for t in chunk.choices[0].logprobs.content]
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
    assert len(tokens) == 6 and "".join(tokens) == text


def test_completions_with_several_prompts_and_echo(sim: SimHandle) -> None:
    r = client(sim).completions.create(
        model=MODEL, prompt=["first prompt", "second prompt"], n=2, max_tokens=3, echo=True, seed=5
    )
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text.startswith("first prompt") and r.choices[3].text.startswith("second prompt")
    assert r.usage is not None and r.usage.completion_tokens == 12
    streamed = list(
        client(sim).completions.create(model=MODEL, prompt="echo me", max_tokens=2, echo=True, stream=True)
    )
    assert streamed[0].choices[0].text == "echo me"
