"""prompt_logprobs and return_token_ids in vLLM's shapes, and the model agreeing with itself: a text scored as
a prompt gets exactly the log-probabilities that generating it reported."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from tests.sim.conftest import MODEL, SimFactory
from tests.sim.http import call, call_json
from tests.sim.test_bad_input import assert_openai_error
from vllm_sim.testing import SimHandle

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


def post(sim: SimHandle, path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, resp = call_json(sim.base_url + path, {"model": MODEL, **body})
    assert status == 200, resp
    return dict(resp)


def test_completion_prompt_logprobs_shape(sim: SimHandle) -> None:
    resp = post(sim, COMPLETIONS, {"prompt": "The sky is blue", "max_tokens": 2, "prompt_logprobs": 3})
    choice = resp["choices"][0]
    ids = post(sim, COMPLETIONS, {"prompt": "The sky is blue", "max_tokens": 1, "return_token_ids": True})[
        "choices"
    ][0]["prompt_token_ids"]
    plp = choice["prompt_logprobs"]
    assert len(plp) == len(ids) == resp["usage"]["prompt_tokens"]
    assert plp[0] is None  # nothing precedes the first token
    for token_id, entry in zip(ids[1:], plp[1:], strict=True):
        keys = list(entry)
        assert keys[0] == str(token_id)  # the prompt's own token first
        assert len(entry) in (3, 4)  # then the top 3 by rank
        for value in entry.values():
            assert list(value) == ["logprob", "rank", "decoded_token"]
            assert value["logprob"] <= 0.0 and value["rank"] >= 1
        top_ranks = [entry[k]["rank"] for k in keys[1:]]
        assert top_ranks == sorted(top_ranks) and top_ranks[-1] == 3
    only_own = post(sim, COMPLETIONS, {"prompt": "The sky is blue", "max_tokens": 1, "prompt_logprobs": 0})
    assert all(len(e) == 1 for e in only_own["choices"][0]["prompt_logprobs"][1:])


def test_chat_prompt_logprobs_are_top_level(sim: SimHandle) -> None:
    resp = post(
        sim,
        CHAT,
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "prompt_logprobs": 1},
    )
    assert resp["prompt_logprobs"][0] is None
    assert len(resp["prompt_logprobs"]) == resp["usage"]["prompt_tokens"]
    assert resp["prompt_token_ids"] is None  # only with return_token_ids


def test_return_token_ids(sim: SimHandle) -> None:
    comp = post(
        sim, COMPLETIONS, {"prompt": "Count", "max_tokens": 5, "ignore_eos": True, "return_token_ids": True}
    )["choices"][0]
    assert len(comp["token_ids"]) == 5 and len(comp["prompt_token_ids"]) >= 2
    tokenized = call_json(sim.base_url + "/tokenize", {"prompt": "Count"})[1]
    assert comp["prompt_token_ids"] == tokenized["tokens"]
    detok = call_json(sim.base_url + "/detokenize", {"tokens": comp["token_ids"]})[1]
    assert detok["prompt"] == comp["text"]
    chat = post(
        sim,
        CHAT,
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    assert len(chat["choices"][0]["token_ids"]) == 3
    assert len(chat["prompt_token_ids"]) == chat["usage"]["prompt_tokens"]


def test_scoring_its_own_output_repeats_its_logprobs(sim: SimHandle) -> None:
    """Teacher forcing on the reference itself: prompt + output sent back as a prompt sees, at every output
    position, the same distribution the generation reported; top-1 is the generated token (greedy)."""
    gen = post(
        sim,
        COMPLETIONS,
        {
            "prompt": "Explain paged attention",
            "max_tokens": 40,
            "temperature": 0,
            "ignore_eos": True,
            "logprobs": 5,
            "return_token_ids": True,
        },
    )["choices"][0]
    prompt_ids, out_ids = gen["prompt_token_ids"], gen["token_ids"]
    scored = post(
        sim,
        COMPLETIONS,
        {"prompt": prompt_ids + out_ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 5},
    )["choices"][0]["prompt_logprobs"][len(prompt_ids) :]
    assert len(scored) == len(out_ids) == 40
    for token, logprob, top, entry in zip(
        gen["logprobs"]["tokens"], gen["logprobs"]["token_logprobs"], gen["logprobs"]["top_logprobs"], scored,
        strict=True,
    ):  # fmt: skip
        own = next(iter(entry.values()))
        assert (own["decoded_token"], own["logprob"], own["rank"]) == (token, logprob, 1)
        assert {v["decoded_token"]: v["logprob"] for v in entry.values()} == top


def test_the_same_scores_in_another_process(sim: SimHandle, sim_factory: SimFactory) -> None:
    other = sim_factory("--max-model-len", "4096")
    body = {"prompt": [5000, 6000, 7000, 8000, 9000], "max_tokens": 1, "prompt_logprobs": 4}
    assert (
        post(sim, COMPLETIONS, body)["choices"][0]["prompt_logprobs"]
        == post(other, COMPLETIONS, body)["choices"][0]["prompt_logprobs"]
    )


def test_prompt_logprobs_validation(sim: SimHandle) -> None:
    base = {"model": MODEL, "prompt": "x", "max_tokens": 1}
    status, body = call_json(sim.base_url + COMPLETIONS, {**base, "prompt_logprobs": 1, "stream": True})
    assert status == 400
    msg = assert_openai_error(body, 400, "Bad Request", "prompt_logprobs")
    assert "`prompt_logprobs` are not available when `stream=True`." in msg
    status, body = call_json(sim.base_url + COMPLETIONS, {**base, "prompt_logprobs": -2})
    msg = assert_openai_error(body, 400, "Bad Request", "prompt_logprobs")
    assert "`prompt_logprobs` must be a positive value or -1." in msg
    status, body = call_json(sim.base_url + COMPLETIONS, {**base, "prompt_logprobs": 21})
    msg = assert_openai_error(body, 400, "BadRequestError", "prompt_logprobs")
    assert msg == (
        "Requested prompt logprobs of 21, which is greater than max allowed: 20 "
        "(parameter=prompt_logprobs, value=21)"
    )
    chat = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "x"}],
        "prompt_logprobs": 1,
        "stream": True,
    }
    status, body = call_json(sim.base_url + CHAT, chat)
    assert_openai_error(body, 400, "Bad Request", "prompt_logprobs")
    # 0 with a stream is accepted, as in vLLM (nothing would be returned).
    status, _, raw = call(sim.base_url + COMPLETIONS, {**base, "prompt_logprobs": 0, "stream": True})
    assert status == 200 and raw.endswith(b"data: [DONE]\n\n")


def test_streamed_token_ids_match_the_whole_response(sim: SimHandle) -> None:
    """return_token_ids with stream: the prompt's ids on the first chunk, each chunk's new ids in its
    choice (vLLM's shape), adding up to what the non-streamed response lists."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Stream me some ids"}],
        "temperature": 0,
        "max_tokens": 20,
        "return_token_ids": True,
        "logprobs": True,
        "top_logprobs": 2,
    }
    status, whole = call_json(sim.base_url + "/v1/chat/completions", body)
    assert status == 200
    req = urllib.request.Request(
        sim.base_url + "/v1/chat/completions",
        data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    chunks = []
    with urllib.request.urlopen(req, timeout=30) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    streamed = [i for c in chunks for ch in c["choices"] for i in ch.get("token_ids") or []]
    assert streamed == whole["choices"][0]["token_ids"]
    tokens = [
        t["token"] for c in chunks for ch in c["choices"] for t in (ch["logprobs"] or {}).get("content", [])
    ]
    assert len(tokens) == len(streamed)
