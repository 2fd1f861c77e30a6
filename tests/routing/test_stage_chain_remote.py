"""Remote stages on a CPU pool, through the official openai client, the real proxy, a simulator as the
generation engine and a controllable CPU engine: a post-stage rewrites streamed and whole answers, a
pre-stage rewrites the prompt, a slow engine fails open (the request goes on untouched) and a failing
one fails closed (a 503 naming the stage), each outcome in the request log and in Prometheus."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from core.redis_client import publish_config_change
from routing.models import RequestLog, StageChain
from tests.routing.conftest import Proc, make_tenant_key
from tests.routing.cpu_engine import CpuEngine, cpu_engine, stream_pieces
from tests.routing.fleet import FleetMember, start_member

pytestmark = pytest.mark.django_db(transaction=True)

ASK: dict[str, Any] = {
    "model": "llama",
    "messages": [{"role": "user", "content": "Tell me a story about the sea"}],
    "max_tokens": 24,
    "seed": 7,
}


@pytest.fixture
def sim(transactional_db: None) -> Iterator[FleetMember]:
    member = start_member("llama")
    yield member
    member.sim.stop()


@pytest.fixture
def cpu(transactional_db: None) -> Iterator[CpuEngine]:
    with cpu_engine() as engine:
        yield engine


def pieces(client: openai.OpenAI, **extra: Any) -> list[str]:
    stream = client.chat.completions.create(**{**ASK, **extra}, stream=True)
    return [c.choices[0].delta.content or "" for c in stream if c.choices]


def whole(client: openai.OpenAI, **extra: Any) -> str:
    return client.chat.completions.create(**{**ASK, **extra}).choices[0].message.content or ""


def set_chain(stages: list[dict[str, Any]]) -> None:
    chain, created = StageChain.objects.get_or_create(
        name="cpu", defaults={"alias": "llama", "stages": stages}
    )
    if not created:
        chain.stages, chain.version = stages, chain.version + 1
        chain.save()
    publish_config_change("stage_chain")


def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.1)


def post(config: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"kind": "generate"}, {"kind": "remote", "name": "tidy", "config": config}]


def outcomes(proxy: Proc, outcome: str) -> float:
    """The proxy's count of requests through the stage `tidy` of the chain `cpu` with `outcome`."""
    text = urllib.request.urlopen(proxy.url + "/metrics", timeout=5).read().decode()
    line_start = f'inferchain_proxy_stage_outcomes_total{{chain="cpu",outcome="{outcome}",stage="tidy"}}'
    found = [line for line in text.splitlines() if line.startswith(line_start)]
    return float(found[0].rsplit(" ", 1)[1]) if found else 0.0


def test_post_stage_rewrites_streamed_and_whole_answers(
    start_proxy: Callable[..., Proc], sim: FleetMember, cpu: CpuEngine
) -> None:
    tk = make_tenant_key("acme")
    proxy = start_proxy()
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0, timeout=30)
    text = whole(client)
    assert text != text.upper()
    set_chain(post({"pool": "cpu", "instruction": "Rewrite the answer in capitals.", "timeout_ms": 5000}))
    eventually(lambda: whole(client) == text.upper())
    streamed = pieces(client)
    assert "".join(streamed) == text.upper()
    # The CPU engine got the stage's instruction and the whole answer, with the model it serves, and
    # streamed its rewrite when the client streams.
    asked = cpu.requests[-1]
    assert asked["model"] == "smollm-cpu" and asked["stream"] is True
    assert not cpu.requests[-2].get("stream")
    assert asked["messages"] == [
        {"role": "system", "content": "Rewrite the answer in capitals."},
        {"role": "user", "content": text},
    ]
    # Usage still comes through when the client asks for it on a held stream.
    chunks = list(client.chat.completions.create(**ASK, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    eventually(
        lambda: RequestLog.objects.filter(route_reason__contains="(tidy rewritten)", stream=True).exists()
    )
    assert outcomes(proxy, "rewritten") >= 3


def test_pre_stage_rewrites_the_prompt(
    start_proxy: Callable[..., Proc], sim: FleetMember, cpu: CpuEngine
) -> None:
    tk = make_tenant_key("acme")
    proxy = start_proxy()
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0, timeout=30)
    cpu.reply = lambda system, user: user + " " + " ".join(["Answer briefly."] * 20)
    set_chain(
        [
            {"kind": "remote", "name": "annotate", "config": {"pool": "cpu", "instruction": "Annotate."}},
            {"kind": "generate"},
        ]
    )
    before = RequestLog.objects.count()

    def rewritten() -> bool:
        # The simulator counts the prompt it got: the annotated one is 60 tokens longer.
        got = client.chat.completions.create(**ASK)
        assert got.usage is not None
        return got.usage.prompt_tokens > 60

    eventually(rewritten)
    assert cpu.requests[-1]["messages"][1] == {"role": "user", "content": "Tell me a story about the sea"}
    eventually(lambda: RequestLog.objects.count() > before)
    eventually(lambda: RequestLog.objects.filter(route_reason__contains="(annotate rewritten)").exists())


def test_slow_engine_fails_open(start_proxy: Callable[..., Proc], sim: FleetMember, cpu: CpuEngine) -> None:
    tk = make_tenant_key("acme")
    proxy = start_proxy()
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0, timeout=30)
    text = whole(client)
    set_chain(post({"pool": "cpu", "instruction": "Capitals.", "timeout_ms": 300, "on_failure": "open"}))
    eventually(lambda: whole(client) == text.upper())
    cpu.delay_s = 3.0
    started = time.monotonic()
    assert whole(client) == text  # as if the stage had passed
    assert "".join(pieces(client)) == text
    assert time.monotonic() - started < 2.5  # each waited the stage's 300 ms, not the engine's 3 s
    eventually(
        lambda: RequestLog.objects.filter(
            route_reason__contains="(tidy timeout, failed open)", status=200, stream=True
        ).exists()
    )
    assert outcomes(proxy, "timeout, failed open") == 2


def test_failing_engine_fails_closed(
    start_proxy: Callable[..., Proc], sim: FleetMember, cpu: CpuEngine
) -> None:
    tk = make_tenant_key("acme")
    proxy = start_proxy()
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0, timeout=30)
    text = whole(client)
    set_chain(post({"pool": "cpu", "instruction": "Capitals.", "on_failure": "closed"}))
    eventually(lambda: whole(client) == text.upper())
    cpu.status = 500
    for call in (whole, pieces):
        with pytest.raises(openai.InternalServerError) as err:
            call(client)
        assert err.value.status_code == 503
        assert err.value.code == "stage_unavailable"
        assert "'tidy'" in err.value.message and "'cpu'" in err.value.message
    eventually(
        lambda: RequestLog.objects.filter(
            route_reason__contains="(tidy error, failed closed)", status=503, stream=True
        ).exists()
    )
    assert outcomes(proxy, "error, failed closed") == 2


def test_a_streamed_rewrite_reaches_the_client_as_the_cpu_engine_writes_it(
    start_proxy: Callable[..., Proc], sim: FleetMember, cpu: CpuEngine
) -> None:
    tk = make_tenant_key("acme")
    proxy = start_proxy()
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0, timeout=30)
    text = whole(client)
    words = len(stream_pieces(text))
    assert words >= 4
    set_chain(post({"pool": "cpu", "instruction": "Capitals.", "timeout_ms": 5000}))
    eventually(lambda: whole(client) == text.upper())
    cpu.piece_delay_s = 0.15
    arrived: list[tuple[float, str]] = []
    started = time.monotonic()
    for chunk in client.chat.completions.create(**ASK, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            arrived.append((time.monotonic() - started, chunk.choices[0].delta.content))
    assert "".join(piece for _, piece in arrived) == text.upper()
    assert len(arrived) == words  # one chunk per piece the CPU engine sent
    # The first piece came long before the CPU engine had written the last one.
    assert arrived[-1][0] - arrived[0][0] >= 0.15 * (words - 1) * 0.8, arrived
    # An engine that dies in the middle: the client has the first pieces, then an error event.
    cpu.break_after = 2
    got: list[str] = []
    with pytest.raises(openai.APIError) as err:
        for chunk in client.chat.completions.create(**ASK, stream=True):
            if chunk.choices:
                got.append(chunk.choices[0].delta.content or "")
    assert err.value.code == "stage_broke_off" and "'tidy'" in err.value.message
    assert "".join(got) == "".join(stream_pieces(text.upper())[:2])
    eventually(
        lambda: RequestLog.objects.filter(
            route_reason__contains="(tidy error, broke off)", stream=True
        ).exists()
    )


def test_a_guard_after_the_rewrite_sees_the_rewritten_text(
    start_proxy: Callable[..., Proc], sim: FleetMember, cpu: CpuEngine
) -> None:
    tk = make_tenant_key("acme")
    proxy = start_proxy()
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0, timeout=30)
    text = whole(client)
    # A term made of the end of one streamed piece and the start of the next.
    cut = stream_pieces(text.upper())
    term = cut[1].rstrip()[-2:] + " " + cut[2][:2]
    masked = text.upper().replace(term, "*" * len(term))
    assert masked != text.upper()
    stages = post({"pool": "cpu", "instruction": "Capitals.", "timeout_ms": 5000})
    stages.append({"kind": "guard", "name": "terms", "config": {"terms": [term.lower()], "action": "mask"}})
    set_chain(stages)
    eventually(lambda: whole(client) == masked)
    cpu.piece_delay_s = 0.05
    assert "".join(pieces(client)) == masked
    eventually(
        lambda: RequestLog.objects.filter(
            route_reason__contains="(tidy rewritten, terms masked)", stream=True
        ).exists()
    )


def test_several_choices_are_each_rewritten(
    start_proxy: Callable[..., Proc], sim: FleetMember, cpu: CpuEngine
) -> None:
    tk = make_tenant_key("acme")
    proxy = start_proxy()
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0, timeout=30)
    texts = [c.message.content or "" for c in client.chat.completions.create(**ASK, n=2).choices]
    set_chain(post({"pool": "cpu", "instruction": "Capitals.", "timeout_ms": 5000}))
    eventually(
        lambda: (
            [c.message.content for c in client.chat.completions.create(**ASK, n=2).choices]
            == [t.upper() for t in texts]
        )
    )
    got: dict[int, str] = {}
    for chunk in client.chat.completions.create(**ASK, n=2, stream=True):
        for choice in chunk.choices:
            got[choice.index] = got.get(choice.index, "") + (choice.delta.content or "")
    assert got == {0: texts[0].upper(), 1: texts[1].upper()}
    # Each choice rewritten whole, not streamed from the CPU engine.
    assert [r.get("stream") for r in cpu.requests[-2:]] == [None, None]


def test_a_cache_hit_still_goes_through_the_remote_rewrite(
    start_proxy: Callable[..., Proc], sim: FleetMember, cpu: CpuEngine
) -> None:
    # The cache keeps the engine's answer before post-stages; a hit must be rewritten as a miss is,
    # streamed or not (the rewrite holds the whole answer and calls the CPU engine).
    tk = make_tenant_key("acme")
    proxy = start_proxy()
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0, timeout=30)
    text = whole(client)
    set_chain(
        [
            {"kind": "cache", "name": "answers"},
            *post({"pool": "cpu", "instruction": "Rewrite the answer in capitals.", "timeout_ms": 5000}),
        ]
    )
    eventually(lambda: whole(client) == text.upper())  # a miss: stored, then rewritten
    asked = len(cpu.requests)
    hit = client.chat.completions.with_raw_response.create(**ASK)
    assert hit.headers["x-inferchain-cache"] == "hit"
    assert hit.parse().choices[0].message.content == text.upper()
    assert "".join(pieces(client)) == text.upper()  # a streamed hit, rewritten too
    assert len(cpu.requests) == asked + 2
