"""The guard stage on a stream holds back only what the longest term needs, finds a split term, and refuses
at the same text however the engine's events were batched."""

from __future__ import annotations

import orjson
import pytest

from routing.proxy.config import ChainSpec
from routing.proxy.errors import ProxyError
from routing.proxy.pipeline.context import RequestContext, StageRun
from routing.proxy.pipeline.relay import RefusedMidStream, staged_events
from routing.proxy.pipeline.stages import Chain, Guard
from routing.proxy.stagespec import StageSpec


def run(guard: Guard, pieces: list[str]) -> list[str]:
    ctx = RequestContext(request_id="r", kind="chat", started=0.0)
    ctx.stage_run = StageRun()
    out = [guard.on_text(ctx, 0, piece) for piece in pieces]
    return [*out, guard.on_end(ctx, 0)]


def test_a_split_term_is_masked_and_only_the_longest_term_minus_one_is_held_back() -> None:
    guard = Guard(StageSpec("guard", "g", {"terms": ["secret", "pin"], "action": "mask"}), "c", post=True)
    pieces = ["The se", "cret code ", "is here", "."]
    out = run(guard, pieces)
    assert "".join(out) == "The ****** code is here."
    sent = 0
    for n, emitted in enumerate(out[:-1]):
        sent += len(emitted)
        received = sum(len(p) for p in pieces[: n + 1])
        assert received - sent <= len("secret") - 1  # at most 5 characters wait for the next piece
    assert out[0] == "T"  # "The se": 6 in, 5 held: a term may be starting


def test_a_split_term_blocks_before_any_of_it_is_sent() -> None:
    guard = Guard(StageSpec("guard", "g", {"terms": ["secret"], "action": "block"}), "c", post=True)
    ctx = RequestContext(request_id="r", kind="chat", started=0.0)
    ctx.stage_run = StageRun()
    sent = guard.on_text(ctx, 0, "well, a se")
    assert "se" not in sent
    with pytest.raises(ProxyError) as err:
        guard.on_text(ctx, 0, "cret")
    assert err.value.code == "content_filter" and err.value.status == 400


def chunk(text: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    body = {"id": "c", "object": "chat.completion.chunk", "choices": [choice]}
    return b"data: " + orjson.dumps(body) + b"\n\n"


def guarded_ctx(term: str) -> RequestContext:
    ctx = RequestContext(request_id="r", kind="chat", started=0.0)
    ctx.chain = Chain(
        ChainSpec(
            "guarded",
            1,
            (),
            StageSpec("generate", "generate", {}),
            (StageSpec("guard", "answer", {"terms": [term], "action": "block"}),),
        )
    )
    ctx.stage_run = StageRun()
    return ctx


def test_a_term_refused_in_a_batch_keeps_what_came_before_it_however_the_stream_was_batched() -> None:
    words = ["Once ", "upon ", "a ", "time ", "a ", "ship ", "sailed"]
    stream = [chunk(w) for w in words]

    # One event per read, as a quick proxy sees a stream; then everything in one read, as a slow one does.
    one_by_one = guarded_ctx("ship")
    sent = b""
    with pytest.raises(RefusedMidStream) as by_one:
        for event in stream:
            sent += staged_events(one_by_one, event, False, False)
    sent += by_one.value.passed
    with pytest.raises(RefusedMidStream) as at_once:
        staged_events(guarded_ctx("ship"), b"".join(stream), False, False)

    assert at_once.value.passed == sent
    texts = [orjson.loads(e[6:])["choices"][0]["delta"]["content"] for e in sent.split(b"\n\n") if e]
    # What came before the word, less the len("ship") - 1 characters the guard held back for it.
    assert "".join(texts) == "Once upon a time a "[: -len("shi")]
    assert at_once.value.error.code == "content_filter"
