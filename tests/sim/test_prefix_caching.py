"""Prefix caching: the blocks of a repeated prefix are reused, so its prefill is skipped."""

from __future__ import annotations

from tests.sim.engine_helpers import make_engine, make_seq, run_to_completion

SHARED = [7000 + i for i in range(2048)]


def ttft_of_second_request(prefix_caching: bool) -> tuple[float, float, int]:
    engine = make_engine(prefix_caching=prefix_caching, max_model_len=8192)
    first = make_seq(16, 1, salt=1, prefix=SHARED)
    engine.add(first)
    run_to_completion(engine)
    second = make_seq(16, 1, salt=2, prefix=SHARED)
    engine.add(second)
    run_to_completion(engine)
    assert first.first_token_at is not None and second.first_token_at is not None
    return (
        first.first_token_at - first.arrival,
        second.first_token_at - second.arrival,
        second.num_cached_prompt_tokens,
    )


def test_repeated_prefix_skips_prefill_and_cuts_ttft() -> None:
    ttft_first, ttft_second, cached = ttft_of_second_request(prefix_caching=True)
    assert cached == 2048  # the whole shared prefix: 128 full blocks of 16
    assert ttft_second < ttft_first / 5


def test_without_prefix_caching_nothing_is_reused() -> None:
    ttft_first, ttft_second, cached = ttft_of_second_request(prefix_caching=False)
    assert cached == 0
    assert abs(ttft_second - ttft_first) / ttft_first < 0.05


def test_hit_counters_count_tokens() -> None:
    engine = make_engine(max_model_len=8192)
    for salt in (1, 2):
        engine.add(make_seq(16, 1, salt=salt, prefix=SHARED))
        run_to_completion(engine)
    queries = engine.metrics.prefix_queries._value.get()
    hits = engine.metrics.prefix_hits._value.get()
    assert queries == 2 * (2048 + 16)
    assert hits == 2048


def test_cached_blocks_are_evicted_lru_when_space_is_needed() -> None:
    # Room for 2064 tokens only: a different long prompt must evict the cached prefix.
    engine = make_engine(max_model_len=2100, num_gpu_blocks_override=132)
    engine.add(make_seq(16, 1, salt=1, prefix=SHARED))
    run_to_completion(engine)
    assert len(engine.pool.cached) == 129
    engine.add(make_seq(2064, 1, salt=3))
    run_to_completion(engine)
    late = make_seq(16, 1, salt=4, prefix=SHARED)
    engine.add(late)
    run_to_completion(engine)
    assert late.num_cached_prompt_tokens < 2048


def test_prompt_tokens_count_cached_ones_and_split_by_source() -> None:
    engine = make_engine(max_model_len=8192)
    for salt in (1, 2):
        engine.add(make_seq(16, 1, salt=salt, prefix=SHARED))
        run_to_completion(engine)
    m = engine.metrics
    assert m.prompt_tokens._value.get() == 2 * (2048 + 16)
    assert m.prompt_tokens_by_source["local_cache_hit"]._value.get() == 2048
    assert m.prompt_tokens_by_source["local_compute"]._value.get() == 2 * (2048 + 16) - 2048
    assert m.prompt_tokens_cached._value.get() == 2048
