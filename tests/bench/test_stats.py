"""The tool's statistics on a synthetic trace whose percentiles are known by construction."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.stats import RequestResult, Slo, percentile, summarize


def trace(n: int = 101) -> list[RequestResult]:
    # Request i starts at 10*i, has TTFT (i+1) ms, then 4 tokens 10 ms apart, so its end-to-end latency is
    # (i+1) + 30 ms and every ITL is exactly 10 ms.
    out = []
    for i in range(n):
        start = 10.0 * i
        first = start + (i + 1) / 1000
        times = [first + k * 0.010 for k in range(4)]
        out.append(
            RequestResult(
                start=start, end=times[-1], ok=True, first_token=first, token_times=times, output_tokens=4
            )
        )
    return out


def test_percentiles_of_a_known_trace() -> None:
    s = summarize(trace(), duration_s=10.0, slo=Slo(ttft_s=0.0505, itl_s=0.020))
    # TTFTs are 1..101 ms: p50 = 51 ms, p90 = 91 ms, p99 = 100 ms exactly (linear interpolation).
    assert s["ttft_s"]["p50"] == pytest.approx(0.051)
    assert s["ttft_s"]["p90"] == pytest.approx(0.091)
    assert s["ttft_s"]["p99"] == pytest.approx(0.100)
    assert s["itl_s"]["p50"] == pytest.approx(0.010)
    assert s["itl_s"]["p99"] == pytest.approx(0.010)
    assert s["latency_s"]["p50"] == pytest.approx(0.081)
    assert s["requests_per_s"] == pytest.approx(10.1)
    assert s["output_tokens_per_s"] == pytest.approx(40.4)
    # Good requests: TTFT <= 50.5 ms (i = 0..49) with TPOT 10 ms <= 20 ms: 50 of 101.
    assert s["goodput_requests_per_s"] == pytest.approx(5.0)
    assert s["slo_met_share"] == pytest.approx(50 / 101)


def test_percentile_matches_numpy_on_random_data() -> None:
    rng = np.random.default_rng(7)
    values = list(rng.lognormal(size=997))
    for q in (0, 1, 50, 90, 95, 99, 99.9, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_errors_count_by_type_and_do_not_enter_latency() -> None:
    results = trace(10)
    results += [
        RequestResult(start=0.0, end=5.0, error="http_429"),
        RequestResult(start=0.0, end=9.0, error="timeout"),
    ]
    results += [RequestResult(start=0.0, end=1.0, error="http_429")]
    s = summarize(results, duration_s=1.0, slo=Slo(ttft_s=1.0, itl_s=1.0))
    assert s["errors"] == {"http_429": 2, "timeout": 1}
    assert s["ok"] == 10 and s["requests"] == 13
    assert s["latency_s"]["p99"] < 1.0  # the 5 s and 9 s failures are not in it
    assert s["goodput_requests_per_s"] == 10


def test_a_slow_stream_misses_the_itl_slo() -> None:
    slow = RequestResult(
        start=0.0, end=1.01, ok=True, first_token=0.01, token_times=[0.01, 1.01], output_tokens=2
    )
    assert not Slo(ttft_s=0.5, itl_s=0.05).met(slow)  # TPOT 1 s
    assert Slo(ttft_s=0.5, itl_s=2.0).met(slow)
    assert math.isclose(slow.tpot or 0, 1.0)
