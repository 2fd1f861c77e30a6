"""The guard stage on a stream holds back only what the longest term needs, and finds a split term."""

from __future__ import annotations

import pytest

from routing.proxy.errors import ProxyError
from routing.proxy.pipeline.context import RequestContext, StageRun
from routing.proxy.pipeline.stages import Guard
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
