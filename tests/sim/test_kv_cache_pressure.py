"""When KV blocks run out, requests wait in the queue, and running ones are preempted and recomputed."""

from __future__ import annotations

from tests.sim.engine_helpers import make_engine, make_seq, run_steps, run_to_completion


def test_requests_queue_when_blocks_run_out() -> None:
    # 40 blocks of 16 tokens = 640 tokens of KV; each request needs 300 prompt tokens (19 blocks).
    engine = make_engine(max_model_len=512, num_gpu_blocks_override=40, max_num_batched_tokens=8192)
    seqs = [make_seq(300, 10, salt=i) for i in range(6)]
    for s in seqs:
        engine.add(s)
    run_steps(engine, 1)
    assert len(engine.running) == 2
    assert len(engine.waiting) == 4
    assert engine.pool.num_free == 40 - 2 * 19
    run_to_completion(engine)
    assert all(s.finish_reason == "length" and len(s.out) == 10 for s in seqs)
    # The later requests waited for blocks: their first token came after the first ones finished.
    first_done = min(s.done_at or 0 for s in seqs[:2])
    assert all((s.first_token_at or 0) >= first_done for s in seqs[2:])
    assert engine.pool.num_free == 40


def test_running_sequences_are_preempted_and_recomputed_under_pressure() -> None:
    # Both prompts fit (2 x 4 blocks of 8), but growing to 64 tokens each needs 2 x 8 blocks > 12.
    engine = make_engine(max_model_len=128, num_gpu_blocks_override=12, block_size=16)
    seqs = [make_seq(60, 60, salt=i) for i in range(2)]
    for s in seqs:
        engine.add(s)
    run_to_completion(engine)
    assert engine.num_preemptions >= 1
    assert engine.metrics.preemptions._value.get() == engine.num_preemptions
    assert all(len(s.out) == 60 and s.finish_reason == "length" for s in seqs)
    # The output does not change because a sequence was recomputed.
    fresh = make_engine(max_model_len=128)
    again = [make_seq(60, 60, salt=i) for i in range(2)]
    for s in again:
        fresh.add(s)
    run_to_completion(fresh)
    assert [s.out for s in seqs] == [s.out for s in again]
    assert fresh.num_preemptions == 0


def test_max_num_seqs_caps_the_running_batch() -> None:
    engine = make_engine(max_model_len=1024, max_num_seqs=4)
    for i in range(10):
        engine.add(make_seq(20, 5, salt=i))
    run_steps(engine, 1)
    assert len(engine.running) == 4 and len(engine.waiting) == 6
