"""The online predictors as plain objects: they learn a linear engine exactly, stay cold until they have
enough samples, bound the output length by max_tokens, and measure their own error and throughput."""

from __future__ import annotations

import random

import pytest

from routing.proxy.predict import LEARN_EVERY, MIN_SAMPLES, Predictors, Rls, host_share


def engine_ttft(prompt: int, inflight_prompt: int, inflight: int) -> float:
    return 0.02 * (1 + prompt / 1000) ** 0.9 * (1 + inflight_prompt / 1000) ** 0.3 * (1 + inflight) ** 0.2


def engine_tpot(inflight: int) -> float:
    return 0.01 * (1 + inflight) ** 0.3


def feed(pred: Predictors, n: int, rng: random.Random, speed: float = 1.0, ep: str = "a") -> list[float]:
    """`n` requests on a synthetic engine whose times are power laws of the features (the predictor's
    model family); the TTFT relative error of each warm prediction."""
    errors = []
    for _ in range(n):
        m = pred.model(ep)
        m.inflight, m.inflight_prompt = rng.randrange(0, 10), rng.randrange(0, 20_000)
        prompt = rng.choice([100, 300, 2000, 6000])
        adm = pred.dispatch(ep, prompt, 0.0)
        ttft = speed * engine_ttft(prompt, adm.inflight_prompt, adm.inflight)
        tpot = speed * engine_tpot(adm.inflight)
        pred.release(adm)
        if adm.predicted_ttft is not None:
            errors.append(abs(adm.predicted_ttft - ttft) / ttft)
        pred.observe(adm, ttft, ttft + tpot * 49, 50, now=0.0)
    return errors


def test_rls_recovers_a_linear_function() -> None:
    rng = random.Random(1)
    rls = Rls(3)
    for _ in range(200):
        x = [1.0, rng.random(), rng.random()]
        rls.update(x, 2.0 + 3.0 * x[1] - 1.0 * x[2])
    assert rls.w == pytest.approx([2.0, 3.0, -1.0], abs=1e-3)


def test_other_pools_engines_learn_from_every_request_until_warm_then_one_in_learn_every() -> None:
    pred = Predictors()
    assert all(pred.learns("a") for _ in range(3 * LEARN_EVERY))  # cold: every one
    feed(pred, MIN_SAMPLES, random.Random(3))
    m = pred.model("a")
    assert m.warm
    picks = [pred.learns("a") for _ in range(5 * LEARN_EVERY)]
    assert picks.count(True) == 5
    # A request not learnt from still counts in flight, and its tokens count towards throughput,
    # but the fits and their error are left alone.
    n, ape, inflight = m.ttft.n, m.ttft_ape, m.inflight
    adm = pred.dispatch("a", 300, 0.0, predict=False)
    assert adm.predicted_ttft is None and m.inflight == inflight + 1
    pred.release(adm)
    pred.observe(adm, 0.5, 1.0, 40, now=0.0, learn=False)
    pred.observe(adm, 0.5, 1.0, 40, now=3.0, learn=False)
    assert (m.ttft.n, m.ttft_ape, m.inflight) == (n, ape, inflight)
    assert m.peak_tokens_per_s > 0


def test_cold_until_min_samples_then_predicts_a_power_law_engine() -> None:
    pred = Predictors()
    rng = random.Random(2)
    feed(pred, MIN_SAMPLES - 1, rng)
    assert not pred.model("a").warm
    assert pred.dispatch("a", 100, 0.0).predicted_ttft is None
    errors = feed(pred, 100, rng)
    assert pred.model("a").warm
    assert max(errors[-50:]) < 0.02
    report = pred.report()[0]
    assert report["warm"] and report["ttft_mape_pct"] < 5 and report["tpot_mape_pct"] < 5


def test_predictions_follow_a_speed_change_within_bounded_requests() -> None:
    pred = Predictors()
    rng = random.Random(3)
    feed(pred, 100, rng)
    after = feed(pred, 80, rng, speed=2.0)
    assert after[0] > 0.4  # the change was not known
    # k requests after it, the old speed weighs FORGET**k of the fit: 0.95**60 < 5 %.
    assert max(after[60:]) < 0.1
    assert max(after[60:]) < max(after[:10]) / 4


def test_dispatch_and_release_count_what_is_in_flight() -> None:
    pred = Predictors()
    first = pred.dispatch("a", 500, 0.0)
    second = pred.dispatch("a", 700, 0.0)
    # Each request sees what was there before it.
    assert (first.inflight, first.inflight_prompt) == (0, 0)
    assert (second.inflight, second.inflight_prompt) == (1, 500)
    pred.release(first)
    assert (pred.model("a").inflight, pred.model("a").inflight_prompt) == (1, 700)


def test_a_whole_answer_teaches_tokens_but_no_latency() -> None:
    pred = Predictors()
    adm = pred.dispatch("a", 100, 0.0)
    pred.observe(adm, None, 1.0, 40, now=0.0)
    assert pred.model("a").ttft.n == 0 and pred.model("a").window_tokens == 40


def test_output_length_learns_the_share_of_max_tokens_and_is_bounded_by_it() -> None:
    pred = Predictors()
    assert pred.output_tokens(1, "m", 512) == 512  # no history: runs to its bound
    assert pred.output_tokens(1, "m", None) == 256
    for _ in range(60):
        pred.observe_output(1, "m", 400, 100)  # a quarter of the bound
        pred.observe_output(1, "m", None, 80)
    assert pred.output_tokens(1, "m", 400) == 100
    assert pred.output_tokens(1, "m", 40) == 10
    assert pred.output_tokens(1, "m", None) == 80
    assert pred.output_tokens(2, "m", 300) == 300  # another tenant's history is its own


def test_throughput_is_the_decayed_peak_rate_and_prices_a_token() -> None:
    pred = Predictors()
    m = pred.model("a")
    assert m.cost_per_token(3.6) is None
    for t in range(11):  # 100 tokens every 0.5 s: 200 tokens/s
        adm = pred.dispatch("a", 10, 0.0)
        pred.release(adm)
        pred.observe(adm, None, 0.5, 100, now=t * 0.5)
    assert m.peak_tokens_per_s == pytest.approx(200.0, rel=0.15)
    # 3.6 per hour is 0.001 per second, over 200 tokens per second.
    assert m.cost_per_token(3.6) == pytest.approx(0.001 / 200, rel=0.15)


def test_host_share_is_the_gpus_held() -> None:
    assert host_share(2, 8) == 0.25
    assert host_share(0, 0) == 1.0
    assert host_share(9, 8) == 1.0


def test_a_remembered_prefix_counts_only_the_rest_of_the_prompt() -> None:
    pred = Predictors()
    key = b"system-prompt-key"
    first = pred.dispatch("a", 1600, 0.0, key)
    assert first.prompt == 1600  # never sent here: all of it to compute
    second = pred.dispatch("a", 1700, 0.0, key)
    assert second.prompt == 101  # the 1,600 shared tokens are likely cached
    elsewhere = pred.dispatch("b", 1700, 0.0, key)
    assert elsewhere.prompt == 1700


def test_predictions_stay_within_the_range_observed() -> None:
    pred = Predictors()
    m = pred.model("a")
    for _ in range(MIN_SAMPLES):
        adm = pred.dispatch("a", 100, 0.0)
        pred.release(adm)
        pred.observe(adm, 0.1, 0.1 + 0.01 * 9, 10, now=0.0)
    m.ttft.w = [0.0, 100.0, 0.0, 0.0]  # a wild fit
    m.refresh()
    assert m.predict_ttft(6000, 0, 0) <= 0.1 * 1.5 + 1e-9
