"""The predicted scorers as pure functions: cold fallback, soonest predicted completion, the cheapest
engine that meets the SLO class, and batch shedding."""

from __future__ import annotations

import math

import pytest

from routing.proxy.predict import MIN_SAMPLES, EndpointModel
from routing.proxy.scorers import EndpointLoad, ScoreRequest, SloUnmet, choose


def model(ep: str, ttft: tuple[float, float], tpot: float, per_inflight: float = 0.0) -> EndpointModel:
    """A warm model: TTFT = ttft[0] x (1 + prompt/1k) ** ttft[1] x (1 + in flight) ** per_inflight,
    TPOT = tpot (its fits are in logs: routing/proxy/predict.py)."""
    m = EndpointModel(ep)
    m.ttft.w = [math.log(ttft[0]), ttft[1], 0.0, per_inflight]
    m.tpot.w = [math.log(tpot), 0.0, 0.0, 0.0]
    m.ttft.n = m.tpot.n = MIN_SAMPLES
    m.refresh()
    return m


def load(m: EndpointModel, inflight: int = 0, cost: float = 0.0) -> EndpointLoad:
    m.inflight = inflight
    m.refresh()
    return EndpointLoad(endpoint_id=m.endpoint_id, inflight=inflight, model=m, cost_per_hour=cost)


FAST_PREFILL = (0.01, 0.5)
SLOW_PREFILL = (0.05, 1.5)
FAST_DECODE = 0.01
SLOW_DECODE = 0.05


def test_cold_candidates_fall_back_to_least_outstanding() -> None:
    warm = model("w", FAST_PREFILL, FAST_DECODE)
    cold = EndpointModel("c")
    loads = [load(warm, inflight=3), load(cold, inflight=1)]
    for scorer in ("predicted_latency", "slo_cost"):
        i, why = choose(scorer, loads, ScoreRequest(prompt_tokens=100, output_tokens=10))
        assert i == 1 and "cold least_outstanding" in why


def test_predicted_latency_weighs_prefill_against_decode_by_output_length() -> None:
    # A: fast prefill, slow decode; B: slow prefill, fast decode.
    a = model("a", FAST_PREFILL, SLOW_DECODE)
    b = model("b", SLOW_PREFILL, FAST_DECODE)
    loads = [load(a), load(b)]
    short = ScoreRequest(prompt_tokens=1000, output_tokens=2)
    long = ScoreRequest(prompt_tokens=1000, output_tokens=200)
    assert choose("predicted_latency", loads, short)[0] == 0
    i, why = choose("predicted_latency", loads, long)
    assert i == 1 and why.startswith("predicted_latency e2e=")


def test_predicted_latency_accounts_for_the_queue_it_joins() -> None:
    a = model("a", FAST_PREFILL, FAST_DECODE, per_inflight=1.0)
    b = model("b", FAST_PREFILL, FAST_DECODE, per_inflight=1.0)
    assert choose("predicted_latency", [load(a, 6), load(b, 2)], ScoreRequest(prompt_tokens=100))[0] == 1


def test_slo_cost_takes_the_cheapest_engine_that_meets_the_targets() -> None:
    cheap_slow = model("cheap", SLOW_PREFILL, SLOW_DECODE)
    dear_fast = model("dear", FAST_PREFILL, FAST_DECODE)
    loads = [load(cheap_slow, cost=1.0), load(dear_fast, cost=8.0)]
    lax = ScoreRequest(prompt_tokens=1000, output_tokens=50, ttft_target_s=2.0, tpot_target_s=0.1)
    i, why = choose("slo_cost", loads, lax)
    assert i == 0 and "cheapest_meeting" in why
    tight = ScoreRequest(prompt_tokens=1000, output_tokens=50, ttft_target_s=0.1, tpot_target_s=0.02)
    assert choose("slo_cost", loads, tight)[0] == 1


def test_slo_cost_prices_by_measured_throughput() -> None:
    # Same speed, the dearer host makes ten times the tokens per second: it is the cheaper per token.
    a = model("a", FAST_PREFILL, FAST_DECODE)
    b = model("b", FAST_PREFILL, FAST_DECODE)
    a.peak_tokens_per_s, b.peak_tokens_per_s = 100.0, 1000.0
    req = ScoreRequest(prompt_tokens=100, output_tokens=10, ttft_target_s=1.0, tpot_target_s=1.0)
    assert choose("slo_cost", [load(a, cost=1.0), load(b, cost=5.0)], req)[0] == 1


def test_slo_cost_unmet_goes_to_the_fastest_or_sheds_batch() -> None:
    a = model("a", SLOW_PREFILL, SLOW_DECODE)
    b = model("b", FAST_PREFILL, SLOW_DECODE)
    loads = [load(a), load(b)]
    req = ScoreRequest(prompt_tokens=1000, output_tokens=10, ttft_target_s=0.001, tpot_target_s=0.001)
    i, why = choose("slo_cost", loads, req)
    assert i == 1 and "none_meet" in why
    req.shed_unmet = True
    with pytest.raises(SloUnmet):
        choose("slo_cost", loads, req)
    # A lone engine sheds too.
    with pytest.raises(SloUnmet):
        choose("slo_cost", loads[:1], req)


def test_predicted_latency_prefers_the_engine_holding_the_prompts_prefix() -> None:
    a = model("a", SLOW_PREFILL, FAST_DECODE)
    b = model("b", SLOW_PREFILL, FAST_DECODE)
    key = b"shared-system-prompt"
    b.remember(3000, key)
    req = ScoreRequest(prompt_tokens=3100, output_tokens=10, prefix_key=key)
    i, _ = choose("predicted_latency", [load(a), load(b)], req)
    assert i == 1
    # Without the key nothing tells them apart but the order.
    assert choose("predicted_latency", [load(a), load(b)], ScoreRequest(prompt_tokens=3100))[0] == 0
