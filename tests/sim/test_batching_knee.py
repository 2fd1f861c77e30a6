"""Continuous batching: output throughput rises almost linearly with batch size while a step is
memory-bound, then flattens past the compute knee (in modelled time, deterministic)."""

from __future__ import annotations

import pytest

from tests.sim.engine_helpers import make_engine, make_seq, run_to_completion
from vllm_sim.profiles import knee_tokens


def decode_throughput(profile: str, batch: int) -> float:
    engine = make_engine(profile, max_model_len=4096, max_num_seqs=1024, max_num_batched_tokens=16384)
    seqs = [make_seq(32, 128, salt=i) for i in range(batch)]
    for s in seqs:
        engine.add(s)
    seconds = run_to_completion(engine)
    assert all(len(s.out) == 128 and s.finish_reason == "length" for s in seqs)
    return batch * 128 / seconds


@pytest.mark.parametrize("profile", ["h100-llama3-8b-fp16", "a10-llama3-8b-int4"])
def test_throughput_rises_with_batch_then_flattens_past_the_knee(profile: str) -> None:
    engine = make_engine(profile, max_model_len=4096)
    knee = knee_tokens(engine.shape)
    small, mid = 1, max(2, int(knee // 8))
    big, bigger = int(knee * 4), int(knee * 8)
    t_small, t_mid = decode_throughput(profile, small), decode_throughput(profile, mid)
    t_big, t_bigger = decode_throughput(profile, big), decode_throughput(profile, bigger)
    # Below the knee a step costs about the same whatever the batch: throughput scales with it.
    assert t_mid / t_small > 0.7 * mid / small
    # Past the knee, doubling the batch buys little.
    assert t_bigger / t_big < 1.25
    assert t_small < t_mid < t_big
