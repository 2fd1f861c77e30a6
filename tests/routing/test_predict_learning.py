"""What the predictors learn from beyond the proxy's own guesses: the prefill queue (a request leaves it at
its first token), the engine's reported prefix-cache hit, a fit robust to one outlier, and slo_cost's
margin growing with the prediction error."""

from __future__ import annotations

import math
import random
import time
from functools import partial

import pytest

from routing.proxy import predict
from routing.proxy.pipeline.context import RequestContext
from routing.proxy.pipeline.relay import usage_from
from routing.proxy.predict import MIN_SAMPLES, EndpointModel, Predictors
from routing.proxy.scorers import EndpointLoad, ScoreRequest, choose


def test_a_request_leaves_the_prefill_queue_at_its_first_token() -> None:
    pred = Predictors()
    first = pred.dispatch("a", 500, 0.0)
    second = pred.dispatch("a", 700, 0.0)
    pred.first_token(first)
    m = pred.model("a")
    # Both still in flight, only the second still waiting for its prefill.
    assert (m.inflight, m.inflight_prompt) == (2, 700)
    third = pred.dispatch("a", 100, 0.0)
    assert (third.inflight, third.inflight_prompt) == (2, 700)
    pred.release(first)  # already out of the queue: not subtracted twice
    assert (m.inflight, m.inflight_prompt) == (2, 800)
    pred.first_token(second)
    pred.first_token(second)  # idempotent
    pred.release(second)
    pred.release(third)
    assert (m.inflight, m.inflight_prompt) == (0, 0)


def test_the_reported_cache_hit_sets_the_shared_length() -> None:
    pred = Predictors()
    key = b"system-prompt-key"
    pred.release(pred.dispatch("a", 1600, 0.0, key))
    guessed = pred.dispatch("a", 1700, 0.0, key)
    assert guessed.prompt == 101  # guessed a hit
    pred.release(guessed)
    pred.observe(guessed, 0.5, 1.0, 10, now=0.0, cached_tokens=0)  # a miss: it is cached now
    after_miss = pred.dispatch("a", 1700, 0.0, key)
    assert after_miss.prompt == 101
    pred.release(after_miss)
    pred.observe(after_miss, 0.5, 1.0, 10, now=0.0, cached_tokens=1536)  # the engine shares 96 blocks
    assert pred.dispatch("a", 1700, 0.0, key).prompt == 1700 - 1536 + 1


def engine_ttft(uncached: int) -> float:
    return 0.02 * (1 + uncached / 1000) ** 0.9


@pytest.mark.parametrize("reported", [True, False])
def test_the_fit_learns_from_the_tokens_the_engine_actually_computed(reported: bool) -> None:
    """Prompts the proxy has no prefix key for, of which the engine caches a random part: told the hit,
    the fit is the engine's; not told it, it cannot be."""
    pred = Predictors()
    rng = random.Random(5)
    for _ in range(200):
        full = rng.choice([500, 2000, 6000, 12000])
        cached = rng.choice([0, full // 2, full - 100])
        adm = pred.dispatch("a", full, 0.0)
        pred.release(adm)
        ttft = engine_ttft(full - cached)
        pred.observe(adm, ttft, ttft + 0.01 * 9, 10, now=0.0, cached_tokens=cached if reported else None)
    m = pred.model("a")
    m.refresh()
    errors = [abs(m.predict_ttft(u, 0, 0) / engine_ttft(u) - 1) for u in (100, 1000, 6000)]
    if reported:
        assert max(errors) < 0.05
    else:
        assert max(errors) > 0.2


def warm_constant(pred: Predictors, rng: random.Random) -> None:
    for _ in range(120):
        prompt = rng.choice([100, 1000, 4000])
        adm = pred.dispatch("a", prompt, 0.0)
        pred.release(adm)
        pred.observe(adm, engine_ttft(prompt), engine_ttft(prompt) + 0.01 * 9, 10, now=0.0)


@pytest.mark.parametrize("robust", [True, False])
def test_one_outlier_barely_moves_the_fit(robust: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not robust:
        monkeypatch.setattr(predict, "HUBER_K", math.inf)
    pred = Predictors()
    rng = random.Random(6)
    warm_constant(pred, rng)
    adm = pred.dispatch("a", 1000, 0.0)
    pred.release(adm)
    pred.observe(adm, 50 * engine_ttft(1000), 50 * engine_ttft(1000) + 0.09, 10, now=0.0)  # one stuck request
    nxt = pred.dispatch("a", 1000, 0.0)
    assert nxt.predicted_ttft is not None
    error = abs(nxt.predicted_ttft / engine_ttft(1000) - 1)
    if robust:
        assert error < 0.1
    else:
        assert error > 0.2


def test_a_sustained_change_still_gets_through_the_clip() -> None:
    pred = Predictors()
    rng = random.Random(7)
    warm_constant(pred, rng)
    errors = []
    for _ in range(80):  # three times slower from now on
        prompt = rng.choice([100, 1000, 4000])
        adm = pred.dispatch("a", prompt, 0.0)
        pred.release(adm)
        ttft = 3 * engine_ttft(prompt)
        assert adm.predicted_ttft is not None
        errors.append(abs(adm.predicted_ttft / ttft - 1))
        pred.observe(adm, ttft, ttft + 0.03 * 9, 10, now=0.0)
    assert errors[0] > 0.5
    assert max(errors[-20:]) < 0.1


def model(ep: str, ttft: float, tpot: float, ape: float | None) -> EndpointModel:
    m = EndpointModel(ep)
    m.ttft.w = [math.log(ttft), 0.0, 0.0, 0.0]
    m.tpot.w = [math.log(tpot), 0.0, 0.0, 0.0]
    m.ttft.n = m.tpot.n = MIN_SAMPLES
    m.ttft_margin = 1.0 + min(ape, predict.SLO_MARGIN_MAX) if ape is not None else 1.0
    m.refresh()
    return m


def test_slo_cost_keeps_a_margin_as_wide_as_the_engines_recent_error() -> None:
    req = ScoreRequest(prompt_tokens=100, output_tokens=10, ttft_target_s=2.0, tpot_target_s=0.1)

    def loads(cheap_error: float | None) -> list[EndpointLoad]:
        cheap = model("cheap", 1.5, 0.05, cheap_error)
        dear = model("dear", 0.2, 0.02, 0.05)
        return [
            EndpointLoad(endpoint_id="cheap", inflight=0, model=cheap, cost_per_hour=1.0),
            EndpointLoad(endpoint_id="dear", inflight=0, model=dear, cost_per_hour=8.0),
        ]

    # Predicted 1.5 s against 2 s: met when its predictions have been within 10 %, ...
    assert choose("slo_cost", loads(0.1), req)[0] == 0
    # ... not when they have been 50 % off (1.5 x 1.5 > 2).
    i, why = choose("slo_cost", loads(0.5), req)
    assert i == 1 and "cheapest_meeting" in why


def test_the_proxy_reads_the_cache_hit_and_the_first_token_for_the_predictors() -> None:
    ctx = RequestContext(request_id="r", kind="chat", started=0.0)
    usage_from(
        ctx, b'{"usage": {"prompt_tokens": 1700, "completion_tokens": 9, "prompt_tokens_details": null}}'
    )
    assert ctx.usage_cached_tokens is None  # not reported: the guess stays
    usage_from(
        ctx,
        b'{"usage": {"prompt_tokens": 1700, "completion_tokens": 9, '
        b'"prompt_tokens_details": {"cached_tokens": 1536}}}',
    )
    assert ctx.usage_cached_tokens == 1536

    pred = Predictors()
    adm = pred.dispatch("a", 1700, 0.0)
    # As try_endpoints sets it: the relay calls it when the answer's first text goes out.
    ctx.on_first_token = partial(pred.first_token, adm)
    assert pred.model("a").inflight_prompt == 1700  # nothing relayed yet: still in prefill
    ctx.first_token_out(time.perf_counter() - 0.2)
    assert ctx.ttft_s is not None and 0.2 <= ctx.ttft_s < 1.0
    assert pred.model("a").inflight_prompt == 0 and not adm.prefilling
