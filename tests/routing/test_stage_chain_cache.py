"""A cache stage in a chain, through the official openai client, the real proxy and a simulator: identical
deterministic requests answered once by the engine, misses for sampled requests and changed parameters,
streamed replay of a whole answer and the reverse, tenant isolation, the bypass headers, TTL expiry, a
post-stage applied to a replay, hits not billed, and the request log's per-stage column."""

from __future__ import annotations

import datetime as dt
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from core.redis_client import get_redis, publish_config_change
from routing.models import RequestLog, StageChain
from routing.proxy.limits import budget_key, tenant_scope
from tests.routing.conftest import Proc, free_port, make_tenant_key
from tests.routing.fleet import FleetMember, start_member

pytestmark = pytest.mark.django_db(transaction=True)

ASK: dict[str, Any] = {
    "model": "llama",
    "messages": [{"role": "user", "content": "Tell me a story about the sea"}],
    "max_tokens": 12,
    "temperature": 0,
}
CACHE = {"kind": "cache", "name": "answers"}


@pytest.fixture
def sim(transactional_db: None, redis_clean: None) -> Iterator[FleetMember]:
    member = start_member("llama")
    yield member
    member.sim.stop()


def engine_requests(sim: FleetMember) -> int:
    """Requests the simulator took (its vllm:request_params_n histogram counts one per request)."""
    with urllib.request.urlopen(sim.sim.base_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return int(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("vllm:request_params_n_count")
        )
    )


def ask(client: openai.OpenAI, **extra: Any) -> tuple[str, str, Any]:
    """(text, x-inferchain-cache, raw response) of a whole answer."""
    raw = client.chat.completions.with_raw_response.create(**{**ASK, **extra})
    return raw.parse().choices[0].message.content or "", raw.headers.get("x-inferchain-cache", ""), raw


def ask_streamed(client: openai.OpenAI, **extra: Any) -> tuple[str, str, list[Any]]:
    """(text, x-inferchain-cache, chunks) of a streamed answer."""
    with client.chat.completions.with_streaming_response.create(**{**ASK, **extra}, stream=True) as raw:
        said = raw.headers.get("x-inferchain-cache", "")
        chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, said, chunks


def set_chain(stages: list[dict[str, Any]], tenant: Any = None, name: str = "cached") -> None:
    chain, created = StageChain.objects.get_or_create(
        name=name, defaults={"alias": "llama", "tenant": tenant, "stages": stages}
    )
    if not created:
        chain.stages, chain.version = stages, chain.version + 1
        chain.save()
    publish_config_change("stage_chain")


def eventually(
    check: Callable[[], bool], timeout: float = 10.0, what: str = "the proxy took the chain"
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def client_for(proxy: Proc, raw_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key=raw_key, max_retries=0, timeout=30)


def test_identical_deterministic_requests_reach_the_engine_once(
    start_proxy: Callable[..., Proc], sim: FleetMember
) -> None:
    acme = make_tenant_key("acme")
    proxy = start_proxy()
    client = client_for(proxy, acme.raw_key)
    set_chain([CACHE, {"kind": "generate"}], tenant=acme.tenant)
    eventually(lambda: ask(client, max_tokens=5)[1] == "miss")

    before = engine_requests(sim)
    first, said, _ = ask(client)
    assert said == "miss" and first
    second, said, raw = ask(client)
    assert said == "hit" and second == first
    assert raw.parse().usage.completion_tokens > 0  # the answer says what it holds; nobody is billed
    assert engine_requests(sim) == before + 1

    # Sampled (temperature above 0, no seed): not cached at all.
    for _ in range(2):
        assert ask(client, temperature=0.7)[1] == "skip"
    assert engine_requests(sim) == before + 3
    # A seed makes a sampled request deterministic; a changed parameter is another entry.
    assert ask(client, temperature=0.7, seed=3)[1] == "miss"
    assert ask(client, temperature=0.7, seed=3)[1] == "hit"
    assert ask(client, max_tokens=9)[1] == "miss"
    assert ask(client, max_tokens=9)[1] == "hit"
    # The `user` field does not change the answer, so it is not part of the key.
    assert ask(client, user="someone")[1] == "hit"
    assert engine_requests(sim) == before + 5

    # Bypass: the client's header sends it to the engine (and the fresh answer replaces the entry).
    text, said, _ = ask(client, extra_headers={"x-inferchain-cache": "bypass"})
    assert said == "bypass" and text == first
    assert ask(client, extra_headers={"cache-control": "no-cache"})[1] == "bypass"
    assert engine_requests(sim) == before + 7
    assert ask(client)[1] == "hit"
    # no-store: neither read nor written; several choices: not cached.
    other = {"messages": [{"role": "user", "content": "Name a colour"}]}
    assert ask(client, **other, extra_headers={"cache-control": "no-store"})[1] == "bypass"
    assert ask(client, **other)[1] == "miss"
    assert ask(client, **other, n=2, temperature=0.7, seed=1)[1] == "skip"  # a seed, but two choices
    assert engine_requests(sim) == before + 10

    # A post-stage applies to what a hit replays (the entry holds the engine's raw answer).
    word = first.split()[0]
    set_chain(
        [
            CACHE,
            {"kind": "generate"},
            {"kind": "guard", "name": "terms", "config": {"terms": [word], "action": "mask"}},
        ],
        tenant=acme.tenant,
    )
    eventually(lambda: "*" * len(word) in ask(client)[0])
    text, said, _ = ask(client)
    assert said == "hit" and word not in text and text.replace("*" * len(word), word) == first
    streamed, said, _ = ask_streamed(client)
    assert said == "hit" and streamed == text
    assert engine_requests(sim) == before + 10


def test_a_streamed_answer_replays_whole_and_the_reverse(
    start_proxy: Callable[..., Proc], sim: FleetMember
) -> None:
    acme = make_tenant_key("acme")
    proxy = start_proxy()
    client = client_for(proxy, acme.raw_key)
    set_chain([CACHE, {"kind": "generate"}], tenant=acme.tenant)
    eventually(lambda: ask(client, max_tokens=5)[1] == "miss")
    before = engine_requests(sim)

    # Stored from a whole answer, replayed as a stream the openai client reads, usage included.
    whole_text, said, _ = ask(client)
    assert said == "miss"
    text, said, chunks = ask_streamed(client, stream_options={"include_usage": True})
    assert said == "hit" and text == whole_text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("length", "stop")
    text, said, chunks = ask_streamed(client)
    assert said == "hit" and text == whole_text and all(c.usage is None for c in chunks)

    # Stored from a streamed answer, replayed whole.
    other = {"messages": [{"role": "user", "content": "Describe a mountain"}]}
    streamed_text, said, _ = ask_streamed(client, **other)
    assert said == "miss" and streamed_text
    text, said, raw = ask(client, **other)
    assert said == "hit" and text == streamed_text
    answer = raw.parse()
    assert answer.choices[0].finish_reason in ("length", "stop") and answer.usage.completion_tokens > 0
    assert engine_requests(sim) == before + 2


def test_tenants_never_share_entries_and_entries_expire(
    start_proxy: Callable[..., Proc], sim: FleetMember
) -> None:
    acme, other = make_tenant_key("acme"), make_tenant_key("other")
    proxy = start_proxy()
    mine, theirs = client_for(proxy, acme.raw_key), client_for(proxy, other.raw_key)
    # One chain for the alias, so both tenants pass the same cache stage.
    set_chain([{**CACHE, "config": {"ttl_s": 2}}, {"kind": "generate"}])
    eventually(lambda: ask(mine, max_tokens=5)[1] == "miss")
    before = engine_requests(sim)

    assert ask(mine)[1] == "miss"
    assert ask(theirs)[1] == "miss"  # the same request, another tenant: not acme's entry
    assert ask(theirs)[1] == "hit"
    assert ask(mine)[1] == "hit"
    assert engine_requests(sim) == before + 2
    time.sleep(2.2)
    assert ask(mine)[1] == "miss"  # past its TTL
    assert engine_requests(sim) == before + 3


def test_a_hit_is_not_billed_and_the_request_log_names_each_stage(
    start_proxy: Callable[..., Proc], sim: FleetMember
) -> None:
    acme = make_tenant_key("acme", requests_per_minute=1000, daily_token_budget=1_000_000)
    proxy = start_proxy()
    client = client_for(proxy, acme.raw_key)
    set_chain(
        [
            {"kind": "guard", "name": "prompt", "config": {"terms": ["forbidden"]}},
            CACHE,
            {"kind": "generate"},
        ],
        tenant=acme.tenant,
    )
    eventually(lambda: ask(client, max_tokens=5)[1] == "miss")
    redis = get_redis()
    budget = budget_key(tenant_scope(acme.tenant.id), dt.datetime.now(dt.UTC).strftime("%Y%m%d"))

    def used() -> int:
        return int(redis.get(budget) or 0)

    _, said, miss = ask(client)
    assert said == "miss"
    # The engine's answer is billed (the reservation is trued up to the tokens used, shortly after).
    tokens = miss.parse().usage.total_tokens
    settled = used()
    for _ in range(20):
        time.sleep(0.3)
        if used() == settled:
            break
        settled = used()
    assert settled >= tokens
    rpm_left = int(miss.headers["x-ratelimit-remaining-requests"])

    _, said, hit = ask(client)
    assert said == "hit"
    # A hit counts as a request (RPM) but uses no tokens.
    assert int(hit.headers["x-ratelimit-remaining-requests"]) < rpm_left
    time.sleep(0.5)
    assert used() == settled
    _, said, _ = ask_streamed(client)
    assert said == "hit"
    time.sleep(0.5)
    assert used() == settled

    eventually(
        lambda: RequestLog.objects.filter(route_reason__contains="answers hit").count() >= 2,
        what="the hits were logged",
    )
    row = RequestLog.objects.filter(route_reason__contains="answers hit").latest("created_at")
    assert row.prompt_tokens == 0 and row.completion_tokens == 0 and row.deployment_id is None
    assert row.stages is not None
    assert [(s["name"], s["kind"], s["outcome"]) for s in row.stages] == [
        ("prompt", "guard", "pass"),
        ("answers", "cache", "hit"),
    ]
    assert all(isinstance(s["ms"], float) and s["ms"] >= 0 for s in row.stages)
    logged = RequestLog.objects.filter(route_reason__contains="answers miss").latest("created_at")
    assert logged.completion_tokens and logged.stages is not None and logged.stages[1]["outcome"] == "miss"

    # A prompt the guard blocks never reaches the cache stage: "not run".
    with pytest.raises(openai.BadRequestError):
        ask(client, messages=[{"role": "user", "content": "forbidden words"}])
    eventually(
        lambda: RequestLog.objects.filter(route_reason__contains="prompt blocked").exists(),
        what="the refusal was logged",
    )
    refused = RequestLog.objects.get(route_reason__contains="prompt blocked")
    assert refused.stages is not None
    assert [s["outcome"] for s in refused.stages] == ["blocked", "not run"]


def test_redis_down_the_cache_fails_open(start_proxy: Callable[..., Proc], sim: FleetMember) -> None:
    acme = make_tenant_key("acme")  # no counted limits: admission needs no Redis either
    set_chain([CACHE, {"kind": "generate"}], tenant=acme.tenant)
    # Nothing listens there: every Redis call of this proxy fails (it loads its config from the database).
    proxy = start_proxy(REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    client = client_for(proxy, acme.raw_key)
    before = engine_requests(sim)
    first, said, _ = ask(client)
    assert said == "miss" and first
    text, said, _ = ask_streamed(client)
    assert said == "miss" and text == first
    assert engine_requests(sim) == before + 2
    eventually(
        lambda: (
            RequestLog.objects.filter(route_reason__contains="answers unavailable, failed open").count() == 2
        ),
        what="the failed-open lookups were logged",
    )
