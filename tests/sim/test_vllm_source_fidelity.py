"""Issue 20, the items left open: the simulator against facts read from vLLM's source at 2f41c894.

The expected wording, limits and rules come from tests/data/vllm/source-2f41c894.json (copied from vLLM's
source with file and line), so each assertion fails if the simulator drifts from what vLLM answers."""

from __future__ import annotations

import json
import pathlib
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nodes.engines.metrics import parse_vllm_metrics
from tests.sim.conftest import MODEL, SimFactory
from tests.sim.http import call, call_json
from vllm_sim.testing import SimHandle, start_sim

REF: dict[str, Any] = json.loads(
    (pathlib.Path(__file__).parents[1] / "data" / "vllm" / "source-2f41c894.json").read_text()
)
CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSGS = [{"role": "user", "content": "Hello there"}]
MAX_LEN = 256


@pytest.fixture(scope="module")
def src() -> Iterator[SimHandle]:
    """vLLM's defaults (max_logprobs 20) with a 256-token context."""
    handle = start_sim(MODEL, "--max-model-len", str(MAX_LEN), time_scale=50.0)
    yield handle
    handle.stop()


def err(body: dict[str, Any]) -> tuple[str, str | None, int, str]:
    e = body["error"]
    assert list(e) == ["message", "type", "param", "code"]
    return e["type"], e["param"], e["code"], e["message"]


def suffix(param: str | None, value: object = None) -> str:
    """str(VLLMValidationError) appends the parameter and value (vllm/exceptions.py:47-54)."""
    parts = [f"parameter={param}"] if param is not None else []
    if value is not None:
        parts.append(f"value={value}")
    return f" ({', '.join(parts)})" if parts else ""


def output_ids(sim: SimHandle, n: int = 3) -> list[int]:
    """Token ids the simulated model writes (so a bias or an allow-list has something to act on)."""
    s, body = call_json(
        sim.base_url + COMP,
        {"prompt": "Pick words", "max_tokens": 40, "ignore_eos": True, "return_token_ids": True, "seed": 3},
    )
    assert s == 200
    ids = list(dict.fromkeys(body["choices"][0]["token_ids"]))
    assert len(ids) >= n
    return ids[:n]


def sse_events(raw: bytes) -> list[str]:
    return [line[len("data: ") :] for line in raw.decode().split("\n\n") if line.startswith("data: ")]


# (a) data parallel: one `engine` series per engine core --------------------------------------------


def test_data_parallel_engines_each_export_their_own_series(sim_factory: SimFactory) -> None:
    h = sim_factory("--max-model-len", str(MAX_LEN), "-dp", "2", time_scale=1.0)
    body = {"prompt": "Hi", "max_tokens": 20, "ignore_eos": True}
    # A stream that has produced its first token is running on a core; a request sent then goes to the
    # other, idle one (least loaded first).
    req = urllib.request.Request(
        h.base_url + COMP,
        data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as stream:
        assert stream.readline().startswith(b"data: ")
        assert call_json(h.base_url + COMP, body)[0] == 200
        stream.read()
    # The X-data-parallel-rank header picks the core (generate/base/serving.py:206-218).
    s, _ = call_json(h.base_url + COMP, {**body, "max_tokens": 5}, headers={"X-data-parallel-rank": "1"})
    assert s == 200
    text = call(h.base_url + "/metrics")[2].decode()
    generated: dict[str, float] = {}
    engines_seen: set[str] = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith("vllm:"):
                continue
            # loggers.py:468-474: model_name and engine on every family (cache_config_info: engine only).
            assert "engine" in sample.labels, sample
            if sample.name != "vllm:cache_config_info":
                assert set(REF["metrics_engine_label"]["labelnames"]) <= set(sample.labels)
            engines_seen.add(sample.labels["engine"])
            if sample.name == "vllm:generation_tokens_total":
                generated[sample.labels["engine"]] = sample.value
            # One API server per rank means the multiprocess collector: no _created series.
            assert not sample.name.endswith("_created"), sample.name
    assert engines_seen == {"0", "1"}
    # The two concurrent requests went to different cores (least loaded first), the pinned one to 1.
    assert generated == {"0": 20.0, "1": 25.0}
    info = [line for line in text.splitlines() if line.startswith("vllm:cache_config_info{")]
    assert len(info) == 2 and {'engine="0"' in info[0], 'engine="1"' in info[1]} == {True}
    # The agent's parser adds the cores up (and averages the usage fraction).
    parsed = parse_vllm_metrics(text)
    assert parsed.generation_tokens_total == 45.0
    stats = call_json(h.base_url + "/sim/stats")[1]
    assert parsed.num_gpu_blocks == 2 * stats["num_gpu_blocks"]
    assert stats["data_parallel_size"] == 2
    # Each rank has its own GPUs (TP 1 here): two modelled GPUs, indices 0 and 1.
    gpus = call_json(h.base_url + "/sim/gpu")[1]["gpus"]
    assert [g["index"] for g in gpus] == [0, 1]


# (b) /v1/chat/completions/batch ------------------------------------------------------------------------


def test_batch_chat_completions(src: SimHandle) -> None:
    convs = [MSGS, [{"role": "user", "content": "Another question here"}]]
    s, body = call_json(
        src.base_url + CHAT + "/batch",
        {"messages": convs, "max_tokens": 4, "ignore_eos": True, "return_token_ids": True, "stream": True},
    )
    # Not streamed: `stream` is not a field of the batch request (chat_completion/protocol.py:1047-1120).
    assert s == 200 and body["object"] == "chat.completion"
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert all(len(c["token_ids"]) == 4 and c["finish_reason"] == "length" for c in body["choices"])
    counts = [call_json(src.base_url + "/tokenize", {"messages": m})[1]["count"] for m in convs]
    assert body["usage"] == {
        "prompt_tokens": sum(counts),
        "total_tokens": sum(counts) + 8,
        "completion_tokens": 8,
        "prompt_tokens_details": None,
    }
    # Each conversation answers as the same conversation sent alone would (greedy).
    alone = call_json(src.base_url + CHAT, {"messages": convs[1], "max_tokens": 4, "temperature": 0})[1]
    batch = call_json(src.base_url + CHAT + "/batch", {"messages": convs, "max_tokens": 4, "temperature": 0})[
        1
    ]
    assert batch["choices"][1]["message"]["content"] == alone["choices"][0]["message"]["content"]
    # The batch path echoes the last message whatever its role (batch_serving.py:288-297).
    echoed = call_json(src.base_url + CHAT + "/batch", {"messages": [MSGS], "max_tokens": 2, "echo": True})[1]
    assert echoed["choices"][0]["message"]["content"].startswith("Hello there")
    # check_batch_mode's refusals (protocol.py:1122-1156).
    s, body = call_json(src.base_url + CHAT + "/batch", {"messages": convs, "n": 2})
    kind, param, _, msg = err(body)
    assert (s, kind, param) == (400, "Bad Request", "n")
    assert REF["batch_chat"]["n_template"] + suffix("n", 2) in msg
    s, body = call_json(src.base_url + CHAT + "/batch", {"messages": convs, "use_beam_search": True})
    assert s == 400 and REF["batch_chat"]["beam_template"] in err(body)[3]
    # An engine-stage refusal of one conversation answers the whole batch.
    s, body = call_json(src.base_url + CHAT + "/batch", {"messages": convs, "logit_bias": {"999999": 1}})
    assert (s, err(body)[1]) == (400, "logit_bias") and "out-of-vocab token ids" in err(body)[3]
    s, body = call_json(src.base_url + CHAT + "/batch", {"messages": [[]]})
    assert s == 400 and err(body)[1] == "body.messages.0" and "'too_short'" in err(body)[3]


def test_role_without_a_generation_prompt_is_the_last_messages(src: SimHandle) -> None:
    # get_chat_request_role (chat_completion/serving.py:398-401), used for the message and the first
    # stream chunk; echo then prefixes that last message (serving.py:1080-1090).
    msgs = [{"role": "user", "content": "Hi"}, {"role": "narrator", "content": "Once"}]
    body = {"messages": msgs, "max_tokens": 2, "add_generation_prompt": False, "echo": True}
    s, plain = call_json(src.base_url + CHAT, body)
    assert s == 200 and plain["choices"][0]["message"]["role"] == "narrator"
    assert plain["choices"][0]["message"]["content"].startswith("Once")
    s, _, raw = call(src.base_url + CHAT, {**body, "stream": True})
    assert json.loads(sse_events(raw)[0])["choices"][0]["delta"]["role"] == "narrator"


# (c) request options ----------------------------------------------------------------------------------


def test_logit_bias_and_allowed_token_ids_act_on_sampling(src: SimHandle) -> None:
    a, b, c = output_ids(src)
    # A +100 bias makes a greedy request write that token only.
    s, body = call_json(
        src.base_url + COMP,
        {"prompt": "Hi", "max_tokens": 6, "temperature": 0, "logit_bias": {str(c): 100},
         "return_token_ids": True, "logprobs": 0},
    )  # fmt: skip
    assert s == 200 and body["choices"][0]["token_ids"] == [c] * 6
    # The reported log-probability is the raw one (logprobs_mode "raw_logprobs", config/model.py:255):
    # what an unbiased request reports for the same token at the same position.
    assert REF["logprobs_mode_default"]["value"] == "raw_logprobs"
    s, plain = call_json(
        src.base_url + COMP,
        {"prompt": "Hi", "max_tokens": 1, "temperature": 0, "logprobs": 0, "logprob_token_ids": [c]},
    )
    biased_lp = body["choices"][0]["logprobs"]["token_logprobs"][0]
    plain_top = plain["choices"][0]["logprobs"]["top_logprobs"][0]
    assert biased_lp < 0 and biased_lp == pytest.approx(list(plain_top.values())[-1])
    # allowed_token_ids masks everything else, also when sampling.
    s, body = call_json(
        src.base_url + COMP,
        {"prompt": "Hi", "max_tokens": 12, "temperature": 1, "seed": 7, "allowed_token_ids": [a, b],
         "return_token_ids": True},
    )  # fmt: skip
    assert s == 200 and set(body["choices"][0]["token_ids"]) <= {a, b}


def test_allowed_token_ids_force_ids_the_model_never_writes(src: SimHandle) -> None:
    # vLLM masks every token outside allowed_token_ids, whatever they are: the sampler must pick among
    # them even when the model would never write one (here, ids of the prompt's own pieces, which the
    # simulated model's ~280 output pieces do not include, and an id it has never seen).
    prompt = call_json(src.base_url + COMP, {"prompt": "Zebra", "max_tokens": 1, "return_token_ids": True})[1]
    ids = prompt["choices"][0]["prompt_token_ids"][1:]  # after the BOS
    foreign = [t for t in ids if not 100 <= t < 380]
    assert foreign, prompt
    ask = {"prompt": "Hi", "max_tokens": 4, "return_token_ids": True, "logprobs": 0}
    for extra in ({"temperature": 0}, {"temperature": 1, "seed": 3}):
        s, body = call_json(src.base_url + COMP, {**ask, **extra, "allowed_token_ids": foreign})
        choice = body["choices"][0]
        assert s == 200 and choice["token_ids"] and set(choice["token_ids"]) <= set(foreign), body
        assert all(lp == -30.0 for lp in choice["logprobs"]["token_logprobs"])  # raw: the model's view
    # A large bias picks one too; the text is the token's own.
    s, body = call_json(src.base_url + COMP, {**ask, "temperature": 0, "logit_bias": {str(foreign[0]): 100}})
    assert s == 200 and body["choices"][0]["token_ids"] == [foreign[0]] * 4
    text = body["choices"][0]["text"]
    assert text and len(text) % 4 == 0 and text[: len(text) // 4] in "Zebra"


def test_logit_bias_refusals_are_vllms(src: SimHandle) -> None:
    s, body = call_json(src.base_url + COMP, {"prompt": "Hi", "logit_bias": {"abc": 1, "7": 2}})
    kind, param, _, msg = err(body)
    expected = REF["logit_bias_keys"]["template"].format(invalid_keys=["abc"])
    assert (s, kind, param) == (400, "BadRequestError", "logit_bias")
    assert msg == expected + suffix("logit_bias", ["abc"])
    s, body = call_json(src.base_url + COMP, {"prompt": "Hi", "logit_bias": {"5": "strong"}})
    assert (s, err(body)[0], err(body)[1]) == (400, "Bad Request", "body.logit_bias.5")
    s, body = call_json(src.base_url + COMP, {"prompt": "Hi", "logit_bias": {"200000": 1, "-3": 1}})
    expected = REF["logit_bias_oov"]["template"].format(invalid_token_ids=[200000, -3], vocab_size=128256)
    assert s == 400 and err(body)[3] == expected + suffix("logit_bias", [200000, -3])
    s, body = call_json(src.base_url + COMP, {"prompt": "Hi", "allowed_token_ids": []})
    assert s == 400 and err(body)[3].startswith(REF["allowed_token_ids"]["empty"])


def test_logprob_token_ids(src: SimHandle) -> None:
    a, b, _ = output_ids(src)
    s, body = call_json(
        src.base_url + CHAT,
        {"messages": MSGS, "max_tokens": 3, "logprobs": True, "logprob_token_ids": [a, b, 7]},
    )
    assert s == 200
    for step in body["choices"][0]["logprobs"]["content"]:
        listed = step["top_logprobs"]
        # The sampled token first, then each requested id once (sampler.py:152-225; return_all).
        assert listed[0]["token"] == step["token"]
        assert len(listed) in (3, 4) and listed[-1]["logprob"] == -30.0  # id 7: no mass in the model
    s, body = call_json(src.base_url + COMP, {"prompt": "Hi", "max_tokens": 2, "logprobs": 0,
                                              "logprob_token_ids": [a, b]})  # fmt: skip
    assert s == 200 and all(len(top) in (2, 3) for top in body["choices"][0]["logprobs"]["top_logprobs"])
    # The validators and SamplingParams' checks, in vLLM's words.
    s, body = call_json(src.base_url + CHAT, {"messages": MSGS, "logprob_token_ids": [a]})
    # chat_completion/protocol.py:809-813, the same words as the batch validator's.
    assert s == 400 and REF["batch_chat"]["logprob_token_ids_template"] in err(body)[3]
    s, body = call_json(src.base_url + COMP, {"prompt": "Hi", "logprob_token_ids": [a]})
    assert s == 400 and REF["check_logprobs_completion"]["ids_without_logprobs"] in err(body)[3]
    limit = REF["logprob_token_ids"]["max"]
    s, body = call_json(src.base_url + COMP, {"prompt": "Hi", "logprobs": 0,
                                              "logprob_token_ids": list(range(limit + 1))})  # fmt: skip
    assert s == 400 and err(body)[3] == REF["logprob_token_ids"]["too_many"].format(
        n=limit + 1, max=limit
    ) + suffix("logprob_token_ids", limit + 1)
    s, body = call_json(src.base_url + COMP, {"prompt": "Hi", "logprobs": 0, "logprob_token_ids": [999999]})
    assert s == 400 and err(body)[3].startswith(
        REF["logprob_token_ids"]["oov"].format(invalid_token_ids=[999999], vocab_size=128256)
    )


def test_truncate_prompt_tokens_with_return_token_ids(src: SimHandle) -> None:
    ids = output_ids(src, 3) * 4  # 12 ids
    s, body = call_json(src.base_url + COMP, {"prompt": ids, "max_tokens": 2, "truncate_prompt_tokens": 5,
                                              "return_token_ids": True})  # fmt: skip
    assert s == 200 and body["choices"][0]["prompt_token_ids"] == ids[:5]
    assert body["usage"]["prompt_tokens"] == 5
    s, body = call_json(
        src.base_url + COMP,
        {
            "prompt": ids,
            "max_tokens": 2,
            "truncate_prompt_tokens": 5,
            "truncation_side": "left",
            "return_token_ids": True,
        },
    )
    assert s == 200 and body["choices"][0]["prompt_token_ids"] == ids[-5:]
    s, body = call_json(
        src.base_url + CHAT,
        {
            "messages": MSGS,
            "max_tokens": 2,
            "truncate_prompt_tokens": 4,
            "truncation_side": "left",
            "return_token_ids": True,
        },
    )
    assert s == 200 and len(body["prompt_token_ids"]) == 4 and body["usage"]["prompt_tokens"] == 4
    # A text over the character bound passes when it is to be truncated (params.py:342-370).
    s, body = call_json(
        src.base_url + COMP,
        {"prompt": "word " * 2000, "max_tokens": 2, "truncate_prompt_tokens": 10, "return_token_ids": True},
    )
    assert s == 200 and len(body["choices"][0]["prompt_token_ids"]) == 10
    s, body = call_json(src.base_url + COMP, {"prompt": ids, "truncate_prompt_tokens": 300})
    expected = REF["truncation"]["too_large"].format(k=300, max_param="max_tokens", max_input=MAX_LEN - 16)
    assert (s, err(body)[1], err(body)[3]) == (400, "truncate_prompt_tokens", expected + suffix(
        "truncate_prompt_tokens", 300))  # fmt: skip


def test_kv_transfer_params_without_a_connector(src: SimHandle) -> None:
    s, body = call_json(
        src.base_url + CHAT,
        {"messages": MSGS, "max_tokens": 2, "kv_transfer_params": {"do_remote_decode": True}},
    )
    assert s == 200 and body["kv_transfer_params"] is None
    s, body = call_json(src.base_url + CHAT, {"messages": MSGS, "kv_transfer_params": [1]})
    assert s == 400 and err(body)[1] == "body.kv_transfer_params"


def test_kv_transfer_prompt_token_ids_are_the_prompt_verbatim(src: SimHandle) -> None:
    # online_renderer.py _reused_prompt_token_ids: the decode stage reuses the prefill stage's ids.
    first = call_json(src.base_url + CHAT, {"messages": MSGS, "max_tokens": 2, "return_token_ids": True})[1]
    ids = first["prompt_token_ids"]
    other = [{"role": "user", "content": "Something else entirely, and much longer than the first."}]
    kv = {"do_remote_prefill": True, "prompt_token_ids": ids}
    s, body = call_json(src.base_url + CHAT, {"messages": other, "max_tokens": 2, "return_token_ids": True,
                                              "kv_transfer_params": kv})  # fmt: skip
    assert s == 200 and body["prompt_token_ids"] == ids and body["usage"]["prompt_tokens"] == len(ids)
    # With media in the messages the ids are dropped and the messages rendered.
    media = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}},
                                          {"type": "text", "text": "Hi"}]}]  # fmt: skip
    s, body = call_json(src.base_url + CHAT, {"messages": media, "max_tokens": 2, "return_token_ids": True,
                                              "kv_transfer_params": kv})  # fmt: skip
    assert body.get("prompt_token_ids") != ids


def test_echo_puts_the_prompts_logprobs_in_front(src: SimHandle) -> None:
    # completion/serving.py: out_logprobs = [*prompt_logprobs, *output.logprobs]; the first prompt token
    # has none.
    prompt = "The quick brown fox"
    ask = {"prompt": prompt, "max_tokens": 3, "echo": True, "logprobs": 1, "temperature": 0}
    s, body = call_json(src.base_url + COMP, ask)
    choice = body["choices"][0]
    lp = choice["logprobs"]
    plain = call_json(src.base_url + COMP, {**ask, "echo": False})[1]["choices"][0]
    n_prompt = body["usage"]["prompt_tokens"]
    assert s == 200 and choice["text"] == prompt + plain["text"]
    assert (
        len(lp["tokens"]) == n_prompt + 3
        and lp["token_logprobs"][0] is None
        and lp["top_logprobs"][0] is None
    )
    assert all(isinstance(x, float) for x in lp["token_logprobs"][1:])
    assert lp["tokens"][n_prompt:] == plain["logprobs"]["tokens"]
    assert lp["text_offset"] == sorted(lp["text_offset"])
    # With return_token_ids the prompt comes back as ids, not in the text.
    s, body = call_json(src.base_url + COMP, {**ask, "return_token_ids": True})
    assert body["choices"][0]["text"] == plain["text"] and body["choices"][0]["prompt_token_ids"]


def test_beam_search_answers_n_beams_best_first(src: SimHandle) -> None:
    # to_beam_search_params: beam_width = n, no SamplingParams checks (n 2 at temperature 0 is fine);
    # the beams are sorted by cumulative logprob / length**length_penalty.
    ask = {"prompt": "Once upon a time", "max_tokens": 5, "n": 2, "temperature": 0, "use_beam_search": True,
           "logprobs": 0}  # fmt: skip
    s, body = call_json(src.base_url + COMP, ask)
    assert s == 200 and [c["index"] for c in body["choices"]] == [0, 1]
    texts = [c["text"] for c in body["choices"]]
    assert texts[0] != texts[1]
    sums = [sum(c["logprobs"]["token_logprobs"]) for c in body["choices"]]
    assert sums[0] >= sums[1]
    assert call_json(src.base_url + COMP, ask)[1]["choices"][0]["text"] == texts[0]  # deterministic
    s, body = call_json(src.base_url + COMP, {**ask, "stream": True})
    assert s == 400 and "Streaming is not currently supported with beam search" in err(body)[3]
    s, body = call_json(src.base_url + COMP, {**ask, "use_beam_search": False})
    assert s == 400 and "n must be 1 when using greedy sampling" in err(body)[3]


def test_minus_one_asks_for_the_whole_vocabulary(sim_factory: SimFactory) -> None:
    h = sim_factory("--max-model-len", str(MAX_LEN), "--max-logprobs", "-1", time_scale=50.0)
    s, body = call_json(
        h.base_url + CHAT, {"messages": MSGS, "max_tokens": 1, "logprobs": True, "top_logprobs": -1}
    )
    assert s == 200
    listed = body["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    assert len(listed) == 128256  # Llama-3's vocabulary (get_vocab_size())
    # completion/serving.py:703-719 lists entry i when `logprobs >= i`: nothing for -1.
    s, body = call_json(h.base_url + COMP, {"prompt": "Hi", "max_tokens": 2, "logprobs": -1})
    assert s == 200 and body["choices"][0]["logprobs"]["top_logprobs"] == [{}, {}]


# (d) item 8's wording -----------------------------------------------------------------------------------


def test_verify_stage_errors_arrive_as_a_stream_event(src: SimHandle) -> None:
    body = {"messages": MSGS, "max_tokens": 2, "logprobs": True, "top_logprobs": 21}
    expected = REF["sample_logprobs_max"]["template"].format(n=21, max_logprobs=20) + suffix("logprobs", 21)
    s, plain = call_json(src.base_url + CHAT, body)
    assert s == 400 and err(plain)[3] == expected
    s, headers, raw = call(src.base_url + CHAT, {**body, "stream": True})
    assert s == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = sse_events(raw)
    # json.dumps with its default spacing (generate/base/serving.py:155-169), then [DONE].
    assert events == [json.dumps(plain), "[DONE]"]


def test_engine_stage_wording(src: SimHandle) -> None:
    ids = output_ids(src, 1) * MAX_LEN
    # Exactly max_model_len tokens with no output limit passes the renderer and stops at the engine.
    s, _, raw = call(src.base_url + COMP, {"prompt": ids, "max_tokens": None, "stream": True})
    event = json.loads(sse_events(raw)[0])
    assert s == 200 and event["error"]["param"] is None
    assert event["error"]["message"] == REF["prompt_len_engine"]["equal_template"].format(
        n=MAX_LEN, max_model_len=MAX_LEN
    )
    s, body = call_json(src.base_url + COMP, {"prompt": [5, -1, 7]})
    assert s == 400 and err(body)[3] == REF["oov_prompt_ids"]["template"].format(id=-1)
    s, body = call_json(src.base_url + COMP, {"prompt": [5, 128256]})
    assert s == 400 and err(body)[3] == REF["oov_prompt_ids"]["template"].format(id=128256)


def test_renderer_and_validator_wording(src: SimHandle) -> None:
    max_in = MAX_LEN - 16
    tmpl = REF["token_len_check"]["template"]
    one = output_ids(src, 1)
    # "at least" exactly when the count is max_input_tokens + 1 (params.py:436-461), token ids too.
    for n, q in ((max_in + 1, "at least "), (max_in + 5, "")):
        s, body = call_json(src.base_url + COMP, {"prompt": one * n})
        expected = tmpl.format(max_total=MAX_LEN, max_output=16, q=q, count=n, total=n + 16)
        assert (s, err(body)[3]) == (400, expected + suffix("input_tokens", n))
    # The character pre-check (params.py:342-370).
    s, body = call_json(src.base_url + COMP, {"prompt": "x" * 20000})
    assert err(body)[1] == "input_text"
    bound = int(err(body)[3].split("(more than ")[1].split(" ")[0])
    expected = REF["text_len_check"]["template"].format(
        max_total=MAX_LEN, max_output=16, chars=20000, bound=bound, max_input=max_in
    )
    assert s == 400 and err(body)[3] == expected + suffix("input_text", 20000)
    # check_logprobs (completion/protocol.py:476-540): its own words, before SamplingParams'.
    s, body = call_json(src.base_url + COMP, {"prompt": "Hi", "logprobs": -2})
    assert s == 400 and err(body)[1] == "logprobs"
    assert "Value error, " + REF["check_logprobs_completion"]["logprobs_negative"] in err(body)[3]
    s, body = call_json(src.base_url + COMP, {"prompt": "Hi", "logprobs": "5"})
    assert s == 400 and REF["check_logprobs_chat"]["not_integer"].format(field="logprobs") in err(body)[3]
    s, body = call_json(src.base_url + COMP, {"prompt": "Hi", "prompt_logprobs": -1})
    n = 128256
    assert s == 400 and err(body)[3] == REF["prompt_logprobs_max"]["template"].format(
        n=n, max_logprobs=20
    ) + suffix("prompt_logprobs", n)
    # The empty prompt names `prompt` (completion/protocol.py:556-575).
    s, body = call_json(src.base_url + COMP, {"prompt": ""})
    kind, param, _, msg = err(body)
    assert (s, kind, param) == (400, "Bad Request", REF["empty_prompt"]["parameter"])
    assert "Value error, " + REF["empty_prompt"]["template"] + suffix("prompt") in msg
    # seed outside int64 (chat_completion/protocol.py:231).
    s, body = call_json(src.base_url + CHAT, {"messages": MSGS, "seed": REF["seed"]["le"] + 1})
    assert s == 400 and err(body)[1] == "body.seed"
    assert "'less_than_equal', 'loc': ('body', 'seed')" in err(body)[3]
    assert f"Input should be less than or equal to {REF['seed']['le']}" in err(body)[3]


# (e) /tokenizer_info ------------------------------------------------------------------------------------


def test_tokenizer_info_answers_tokenizer_config_keys(sim_factory: SimFactory) -> None:
    h = sim_factory("--max-model-len", str(MAX_LEN), "--enable-tokenizer-info-endpoint")
    s, info = call_json(h.base_url + "/tokenizer_info")
    # TokenizerInfoResponse: tokenizer_class plus the tokenizer's init kwargs (tokenize/serving.py:163-184);
    # no chat_template unless --chat-template was given.
    assert s == 200 and info["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert info["bos_token"] == "<|begin_of_text|>" and "chat_template" not in info
    assert not {"vocab_file", "merges_file", "source"} & set(info)
