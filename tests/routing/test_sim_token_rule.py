"""Simulated models without a tokenizer file: the proxy counts with the simulator's own documented rule
(vllm_sim/text.py), so its count is exactly the engine's usage.prompt_tokens for the demo's
conversations (the estimate of 4 characters a token was 25% off and misrouted prompts)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from inferchain.demo_traffic import WORDS, demo_request
from routing.proxy.tokens import count_prompt_tokens, count_sim_rule, prompt_text_parts
from vllm_sim.protocol import ServingLimits, parse_chat, parse_completion

MODEL = "llama-3.1-8b"
LIMITS = ServingLimits(served_names=[MODEL], max_model_len=131072, max_logprobs=20)
TOUR = [  # README's tour, then conversations of other shapes the demo's clients send
    {"model": MODEL, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32},
    {"model": MODEL, "messages": [{"role": "user", "content": "Count to five."}], "stream": True},
    {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What's 2+2? Answer in digits, e.g. '4'."},
            {"role": "assistant", "content": "4"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "And 3 \u00d7 3?"}, {"type": "text", "text": "ok"}],
            },
        ],
    },
    {"model": MODEL, "messages": [{"role": "wizard", "content": "  spaced\n\n  out  "}, {"role": "user"}]},
    {"model": MODEL, "messages": [{"role": "user", "content": "no header"}], "add_generation_prompt": False},
]


def engine_count(body: dict[str, Any], kind: str) -> int:
    """usage.prompt_tokens as the simulator computes it (its own request parsing, built-in tokenizer)."""
    parsed = parse_chat(body, LIMITS) if kind == "chat" else parse_completion(body, LIMITS)
    return sum(len(ids) for ids, _ in parsed.prompts)


@pytest.mark.parametrize("seed", range(200))
def test_demo_traffic_conversations_count_as_the_engine_counts(seed: int) -> None:
    body, _ = demo_request(random.Random(seed), MODEL)
    counted = count_sim_rule(body, "chat")
    assert counted.tokens == engine_count(body, "chat") and not counted.estimated


@pytest.mark.parametrize("body", TOUR, ids=range(len(TOUR)))
def test_tour_conversations_count_as_the_engine_counts(body: dict[str, Any]) -> None:
    assert count_sim_rule(body, "chat").tokens == engine_count(body, "chat")


def test_completion_prompts_count_as_the_engine_counts() -> None:
    for prompt in ("Once upon a time", ["first prompt", "a second, longer prompt with 123456 digits"]):
        body = {"model": MODEL, "prompt": prompt}
        assert count_sim_rule(body, "completion").tokens == engine_count(body, "completion")


def test_a_prompt_the_estimate_sent_to_the_long_pool_now_counts_under_the_fast_pools_limit() -> None:
    rng = random.Random(7)
    content = " ".join(rng.choice(WORDS) for _ in range(5000))
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}]}
    exact = count_sim_rule(body, "chat").tokens
    assert 5000 < exact < 6000 and exact == engine_count(body, "chat")
    estimate = count_prompt_tokens(prompt_text_parts(body, "chat"), None, ["user"])
    assert estimate.estimated and estimate.tokens > 6000  # the old count: over llama-fast's limit
