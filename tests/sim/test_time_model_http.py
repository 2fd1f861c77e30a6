"""The time model seen from a client over HTTP (real time, real sockets): batching raises throughput,
a full KV cache makes requests queue, a cached prefix cuts time to first token."""

from __future__ import annotations

import asyncio
import threading
import time

from tests.sim.conftest import MODEL, SimFactory
from tests.sim.http import call, call_json
from vllm_sim.loadgen import prompt_of, run_streams, summarize


def metric(base_url: str, name: str) -> float:
    _, _, body = call(base_url + "/metrics")
    for line in body.decode().splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(name)


def test_sixteen_streams_get_many_times_the_throughput_of_one(sim_factory: SimFactory) -> None:
    sim = sim_factory("--max-model-len", "4096", time_scale=1.0)
    one = summarize(
        asyncio.run(run_streams(sim.base_url, MODEL, concurrency=1, prompt_words=20, max_tokens=100))
    )
    many = summarize(
        asyncio.run(run_streams(sim.base_url, MODEL, concurrency=16, prompt_words=20, max_tokens=100))
    )
    assert one["ok"] == 1 and many["ok"] == 16
    assert many["output_tokens_per_s"] > 8 * one["output_tokens_per_s"]
    # Memory-bound decode: 16 streams barely slow each other down.
    assert many["itl_median_s"] < 1.5 * one["itl_median_s"]


def test_requests_wait_when_the_kv_cache_is_full(sim_factory: SimFactory) -> None:
    # 64 blocks x 16 = 1024 tokens of KV; each request grows to ~360 tokens, so only two run at once.
    sim = sim_factory("--max-model-len", "1024", "--num-gpu-blocks-override", "64", time_scale=2.0)
    results: list[int] = []

    def one(i: int) -> None:
        # Distinct prompts: identical ones would share their blocks through the prefix cache.
        body = {"model": MODEL, "prompt": prompt_of(250, salt=i), "max_tokens": 100, "ignore_eos": True}
        results.append(call(sim.base_url + "/v1/completions", body)[0])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    max_waiting = 0.0
    max_running = 0.0
    while any(t.is_alive() for t in threads):
        max_waiting = max(max_waiting, metric(sim.base_url, "vllm:num_requests_waiting"))
        max_running = max(max_running, metric(sim.base_url, "vllm:num_requests_running"))
        time.sleep(0.02)
    for t in threads:
        t.join()
    assert results == [200] * 6
    assert max_waiting >= 3
    assert max_running <= 3
    assert metric(sim.base_url, "vllm:kv_cache_usage_perc") == 0.0


def test_a_cached_prefix_cuts_time_to_first_token(sim_factory: SimFactory) -> None:
    sim = sim_factory("--max-model-len", "16384", time_scale=1.0)
    system = prompt_of(7500)  # 7500 tokens of shared system prompt

    def ttft(question: str) -> float:
        res = asyncio.run(run_streams(sim.base_url, MODEL, concurrency=1, prompt_words=0, max_tokens=2,
                                      system_prompt=system, question=question))  # fmt: skip
        return res[0].ttft

    cold = ttft("first question")
    warm = ttft("second question")
    assert warm < cold / 3
    hits = metric(sim.base_url, "vllm:prefix_cache_hits_total")
    assert hits >= 7000


def test_prefix_caching_off_gives_no_speed_up(sim_factory: SimFactory) -> None:
    sim = sim_factory("--max-model-len", "16384", "--no-enable-prefix-caching", time_scale=1.0)
    system = prompt_of(7500)
    times = []
    for q in ("first question", "second question"):
        res = asyncio.run(run_streams(sim.base_url, MODEL, concurrency=1, prompt_words=0, max_tokens=2,
                                      system_prompt=system, question=q))  # fmt: skip
        times.append(res[0].ttft)
    assert times[1] > times[0] * 0.7
    _, stats = call_json(sim.base_url + "/sim/stats")
    assert stats["steps"] > 0
