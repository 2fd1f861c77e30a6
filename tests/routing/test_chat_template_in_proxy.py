"""The proxy admits chat prompts by their templated length and routes prefix affinity on token blocks.

The alias's version points at a small tokenizer directory with a ChatML template (tests/routing/
chat_tokenizer.py), so every count can be worked out by hand.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from models_registry.models import ModelAlias
from routing.models import RequestLog, RoutePool
from tests.routing.chat_tokenizer import (
    DEFAULT_SYSTEM,
    GENERATION_PROMPT,
    MESSAGE_OVERHEAD,
    write_tokenizer_dir,
)
from tests.routing.conftest import Proc, make_tenant_key, post
from tests.routing.fleet import FleetMember, start_member

pytestmark = pytest.mark.django_db(transaction=True)


def _use_tokenizer(alias: str, directory: Path) -> None:
    version = ModelAlias.objects.get(name=alias).active_version
    assert version is not None
    version.tokenizer_path = str(write_tokenizer_dir(directory))
    version.save(update_fields=["tokenizer_path"])


def _rows(n: int) -> list[RequestLog]:
    deadline = time.monotonic() + 5
    while RequestLog.objects.count() < n and time.monotonic() < deadline:
        time.sleep(0.1)
    return list(RequestLog.objects.order_by("id"))


@pytest.fixture
def short_member(transactional_db: None, redis_clean: None) -> Iterator[FleetMember]:
    member = start_member("llama", max_model_len=64)
    yield member
    member.sim.stop()


def test_templated_length_over_max_model_len_is_refused_before_the_engine(
    start_proxy: Callable[..., Proc], short_member: FleetMember, tmp_path: Path
) -> None:
    _use_tokenizer("llama", tmp_path)
    tk = make_tenant_key()
    proxy = start_proxy()
    url = proxy.url + "/v1/chat/completions"
    templated = MESSAGE_OVERHEAD + DEFAULT_SYSTEM + GENERATION_PROMPT
    # 55 content tokens: with the old guess (4 per message) the prompt fit in 64; with the template it is 68.
    content = " ".join(itertools.islice(itertools.cycle(["the", "quick", "brown", "fox", "jumps"]), 55))
    reply = post(url, tk.raw_key, {"model": "llama", "messages": [{"role": "user", "content": content}]})
    assert reply.status == 400, reply.text
    error = reply.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["type"] == "invalid_request_error"
    # vLLM's wording: it stops tokenizing one token past the room left, hence "at least".
    assert error["message"].startswith(
        "This model's maximum context length is 64 tokens. However, you requested 0 output tokens and "
        "your prompt contains at least 65 input tokens"
    )
    # A shorter prompt reaches the same engine: the refusal was the length, not a missing endpoint.
    fits = " ".join(content.split()[:20])
    ok = post(
        url, tk.raw_key, {"model": "llama", "messages": [{"role": "user", "content": fits}], "max_tokens": 1}
    )
    assert ok.status == 200, ok.text
    rows = _rows(2)
    assert [(r.status, r.error_type) for r in rows] == [(400, "context_length_exceeded"), (200, "")]
    # The refused one never reached an engine.
    assert rows[0].deployment_id is None and rows[1].deployment_id == short_member.deployment.pk
    assert not rows[0].prompt_tokens_estimated and rows[0].prompt_tokens == 55 + templated


def test_prefix_affinity_on_token_blocks(
    start_proxy: Callable[..., Proc], three_sims: list[FleetMember], tmp_path: Path
) -> None:
    _use_tokenizer("llama", tmp_path)
    RoutePool.objects.create(name="llama", alias="llama", scorer="prefix_affinity")
    tk = make_tenant_key()
    proxy = start_proxy()
    url = proxy.url + "/v1/chat/completions"
    system = "you are a helpful bot over the lazy dog " * 40  # 360 tokens: past the 16 hashed blocks

    def chat(messages: list[dict[str, str]]) -> None:
        reply = post(url, tk.raw_key, {"model": "llama", "messages": messages, "max_tokens": 2})
        assert reply.status == 200, reply.text

    questions = ["alpha bravo", "charlie", "delta echo foxtrot", "golf hotel", "the fox"]
    for n, question in enumerate(questions):
        # The word-level tokenizer ignores spacing, so these share their tokens but not their characters:
        # only a key on token blocks keeps them together.
        spaced = system.replace(" ", "  ", n + 1)
        chat([{"role": "system", "content": spaced}, {"role": "user", "content": question}])
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "lorem", "ipsum"]
    for perm in itertools.islice(itertools.permutations(words, 4), 0, 240, 20):
        chat([{"role": "user", "content": (" ".join(perm) + " the quick brown fox ") * 3}])  # 24 tokens
    rows = _rows(17)
    assert len(rows) == 17 and all(r.status == 200 for r in rows)
    assert len({r.deployment_id for r in rows[:5]}) == 1
    assert len({r.deployment_id for r in rows[5:]}) >= 2
    assert all("prefix_affinity rank=" in r.route_reason for r in rows)
