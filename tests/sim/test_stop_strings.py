"""Stop strings end generation with finish_reason "stop" and stop_reason = the string, which is not part
of the text, streamed or not."""

from __future__ import annotations

import json

from tests.sim.conftest import MODEL
from tests.sim.http import call, call_json
from vllm_sim.testing import SimHandle

PROMPT = "Tell me about the weather"


def greedy_text(sim: SimHandle, max_tokens: int) -> str:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    return str(call_json(sim.base_url + "/v1/completions", body)[1]["choices"][0]["text"])


def test_stop_string_spanning_tokens_is_cut_streamed_and_not(sim: SimHandle) -> None:
    full = greedy_text(sim, 40)
    words = full.split(" ")
    # A stop string made of the end of word 5 and the start of word 6: it spans two tokens.
    stop = words[5][-2:] + " " + words[6][:2]
    expected = full[: full.index(stop)]
    body = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": 40,
        "temperature": 0,
        "ignore_eos": True,
        "stop": [stop],
    }
    _, plain = call_json(sim.base_url + "/v1/completions", body)
    choice = plain["choices"][0]
    assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == (expected, "stop", stop)
    _, _, raw = call(sim.base_url + "/v1/completions", {**body, "stream": True})
    chunks = [json.loads(e[6:]) for e in raw.decode().split("\n\n") if e.startswith("data: {")]
    assert "".join(c["choices"][0]["text"] for c in chunks) == expected
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"][0]["stop_reason"] == stop
