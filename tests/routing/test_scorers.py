"""Each scorer as a pure function: what it picks and why, including stale state and hot prefixes."""

from __future__ import annotations

from collections import Counter

from routing.proxy.scorers import EndpointLoad, ScoreRequest, choose, prefix_key, seed_random


def loads(*inflight: int, free: list[int | None] | None = None, total: int = 10_000) -> list[EndpointLoad]:
    free = free or [None] * len(inflight)
    return [
        EndpointLoad(endpoint_id=f"e{i}", inflight=n, kv_free_tokens=f, kv_total_tokens=total)
        for i, (n, f) in enumerate(zip(inflight, free, strict=True))
    ]


def test_round_robin_cycles_through_all() -> None:
    picks = [choose("round_robin", loads(5, 0, 9), ScoreRequest(), rr=i)[0] for i in range(6)]
    assert picks == [0, 1, 2, 0, 1, 2]


def test_random_reaches_every_endpoint() -> None:
    picks = Counter(choose("random", loads(0, 0, 0), ScoreRequest())[0] for _ in range(300))
    assert set(picks) == {0, 1, 2}


def test_seeded_random_repeats_its_draws() -> None:
    def draws(seed: int) -> list[int]:
        seed_random(seed)
        return [choose("random", loads(0, 0, 0, 0), ScoreRequest())[0] for _ in range(50)]

    assert draws(17) == draws(17)
    assert draws(17) != draws(18)


def test_least_outstanding_takes_the_idlest() -> None:
    assert choose("least_outstanding", loads(4, 1, 3), ScoreRequest())[0] == 1


def test_best_fit_takes_least_leftover_and_treats_stale_as_busy() -> None:
    candidates = loads(0, 0, 0, free=[5000, 1200, None])
    index, reason = choose("best_fit", candidates, ScoreRequest(tokens_needed=1000))
    assert index == 1 and "leftover=200" in reason
    # Nobody fits: the most free space; a stale endpoint (None) is never assumed to have room.
    assert choose("best_fit", loads(0, 0, free=[300, None]), ScoreRequest(tokens_needed=1000))[0] == 0


def test_best_fit_never_piles_onto_the_tightest_engine_past_the_load_bound() -> None:
    # Engine 1 fits tightest but already has 6 in flight against 0 and 1 elsewhere: past the bound
    # (ceil(8 / 3 x 1.25) = 4), so the tightest fit among the others wins.
    candidates = loads(1, 6, 0, free=[5000, 1200, 9000])
    index, reason = choose("best_fit", candidates, ScoreRequest(tokens_needed=1000))
    assert index == 0 and "leftover=4000" in reason
    # Every fitting engine past the bound: the least loaded of them.
    crowded = loads(9, 8, 0, free=[5000, 1200, 500])
    index, reason = choose("best_fit", crowded, ScoreRequest(tokens_needed=1000))
    assert index == 1 and "over_bound" in reason


def test_prefix_affinity_is_sticky_and_bounded() -> None:
    shared = "You are a helpful assistant. " * 40
    key = prefix_key(shared + "question one")
    assert key == prefix_key(shared + "a different question")
    idle = loads(0, 0, 0, 0)
    home = choose("prefix_affinity", idle, ScoreRequest(prefix_key=key))[0]
    assert all(choose("prefix_affinity", idle, ScoreRequest(prefix_key=key))[0] == home for _ in range(5))
    # The home endpoint is hot: bounded load sends the request elsewhere instead of piling on.
    hot = loads(*[20 if i == home else 1 for i in range(4)])
    assert choose("prefix_affinity", hot, ScoreRequest(prefix_key=key))[0] != home


def test_prefix_keys_spread_over_endpoints() -> None:
    homes = {
        choose("prefix_affinity", loads(0, 0, 0, 0), ScoreRequest(prefix_key=prefix_key(f"{i} " * 200)))[0]
        for i in range(40)
    }
    assert len(homes) >= 3


def test_session_affinity_follows_the_header_value() -> None:
    idle = loads(0, 0, 0)
    first = choose("session_affinity", idle, ScoreRequest(session_key="user-42"))[0]
    assert all(
        choose("session_affinity", idle, ScoreRequest(session_key="user-42"))[0] == first for _ in range(5)
    )
    # No session header: least outstanding.
    assert choose("session_affinity", loads(3, 0, 2), ScoreRequest())[0] == 1


def test_weighted_balances_load_against_kv_headroom() -> None:
    candidates = loads(1, 1, free=[9000, 1000])
    assert (
        choose("weighted", candidates, ScoreRequest(tokens_needed=100), weights={"load": 1, "kv": 1})[0] == 0
    )
    busy_but_roomy = loads(60, 0, free=[9000, 1000])
    picked = choose("weighted", busy_but_roomy, ScoreRequest(tokens_needed=100), weights={"load": 5, "kv": 1})
    assert picked[0] == 1
