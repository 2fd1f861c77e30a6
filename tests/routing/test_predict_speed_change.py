"""The latency predictors learn an engine's speed from its answers, and follow it when it changes.

A real simulator (vllm_sim, a subprocess on loopback) answers streamed requests of varied prompt
lengths at varied concurrency; the predictor sees only what the proxy would (prompt tokens, what is in
flight, TTFT, duration, tokens) and nothing of the simulator's time model. Half-way the simulator's
hardware is made three times slower at run time (POST /sim/slowdown): the first predictions after that
are far too low, and within a bounded number of requests they have caught up.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Iterator

import aiohttp
import pytest

from routing.proxy.predict import MIN_SAMPLES, Predictors
from vllm_sim.loadgen import one_stream, prompt_of
from vllm_sim.testing import SimHandle, start_sim

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# Requests after the change within which the predictions must have caught up: their median signed
# relative error back within BOUND.
FOLLOW_WITHIN = 64
BOUND = 0.25
SLOWDOWN = 3.0


@pytest.fixture
def sim() -> Iterator[SimHandle]:
    handle = start_sim(MODEL, "--max-model-len", "4096", time_scale=1.0)
    yield handle
    handle.stop()


async def run_requests(
    session: aiohttp.ClientSession, sim: SimHandle, pred: Predictors, count: int, rng: random.Random
) -> list[tuple[float, float]]:
    """`count` streamed requests in waves of 1-4 at once; per request with a prediction, the relative
    error of its TTFT and TPOT predictions (observed / predicted - 1, signed)."""
    errors: list[tuple[float, float]] = []
    done = 0
    while done < count:
        wave = min(count - done, rng.randint(1, 4))

        async def one(i: int) -> None:
            words = rng.choice([40, 150, 600, 1500])
            # Staggered, so each request reaches the engine in the order it was counted in flight.
            await asyncio.sleep(0.03 * i)
            # The prompt's token count as the proxy would have counted it: words are ~1.3 tokens each
            # here, and the engine's usage tells the exact number after the fact.
            adm = pred.dispatch("sim", int(words * 1.3), 0.0)
            try:
                res = await one_stream(
                    session,
                    sim.base_url + "/v1/chat/completions",
                    MODEL,
                    [{"role": "user", "content": prompt_of(words, salt=rng.randrange(1 << 30))}],
                    12,
                    {"Content-Type": "application/json"},
                )
            finally:
                pred.release(adm)
            assert res.status == 200
            pred.observe(adm, res.ttft, res.e2e, res.completion_tokens)
            if adm.predicted_ttft is not None and adm.predicted_tpot is not None:
                tpot = (res.e2e - res.ttft) / (res.completion_tokens - 1)
                errors.append(
                    (res.ttft / max(adm.predicted_ttft, 1e-6) - 1, tpot / max(adm.predicted_tpot, 1e-6) - 1)
                )

        await asyncio.gather(*(one(i) for i in range(wave)))
        done += wave
    return errors


async def scenario(sim: SimHandle) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    pred = Predictors()
    rng = random.Random(7)
    async with aiohttp.ClientSession() as session:
        before = await run_requests(session, sim, pred, 64, rng)
        async with session.post(sim.base_url + f"/sim/slowdown?factor={SLOWDOWN}") as resp:
            assert resp.status == 200
        after = await run_requests(session, sim, pred, FOLLOW_WITHIN + 16, rng)
    assert pred.model("sim").warm
    return before, after


def bias(errors: list[tuple[float, float]], which: int) -> float:
    """The median signed relative error: how far the predictions are off the engine's speed. (Single
    requests scatter around it: which others arrive during a request's prefill and decode is unknown
    at its admission, and this shared machine's scheduling adds its own noise.)"""
    return statistics.median(e[which] for e in errors)


def test_predictions_follow_a_run_time_speed_change(sim: SimHandle) -> None:
    before, after = asyncio.run(scenario(sim))
    # Warm after MIN_SAMPLES: the last requests before the change were predicted without bias.
    assert len(before) >= 64 - MIN_SAMPLES - 4
    assert abs(bias(before[-16:], 0)) < BOUND
    assert abs(bias(before[-16:], 1)) < BOUND
    # The change is real and the predictor did not know it: the first answers after it were much
    # slower than predicted (each step takes SLOWDOWN times as long).
    assert bias(after[:8], 1) > 1.0
    assert bias(after[:8], 0) > 0.5
    # Within FOLLOW_WITHIN requests of the change the predictions have caught up.
    settled = after[FOLLOW_WITHIN - 16 : FOLLOW_WITHIN]
    assert abs(bias(settled, 0)) < BOUND
    assert abs(bias(settled, 1)) < BOUND
