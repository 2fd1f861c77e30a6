"""The canary draw on its own: stable, monotone in the share, exact at the bound, independent per rollout."""

from __future__ import annotations

from routing.proxy.canary import bucket, digest, draw, on_candidate
from routing.proxy.config import Canary, share_threshold

SESSIONS = [f"conversation-{i}" for i in range(20_000)]


def _canary(share: float, rollout_id: int = 7, sticky_by: str = "session") -> Canary:
    return Canary(
        rollout_id=rollout_id,
        version_id=2,
        share=share,
        sticky_by=sticky_by,
        salt=f"{rollout_id}:".encode(),
        threshold=share_threshold(share),
    )


def _drawn(canary: Canary) -> set[str]:
    return {s for s in SESSIONS if draw(canary, s, tenant_id=1)}


def test_a_rising_share_only_adds_sessions_and_each_share_is_its_fraction() -> None:
    previous: set[str] = set()
    for share in (0, 0.5, 1, 5, 25, 50, 99.5, 100):
        drawn = _drawn(_canary(share))
        assert previous <= drawn, share  # nobody leaves the candidate when the share rises
        assert abs(len(drawn) - share / 100 * len(SESSIONS)) <= max(4 * (len(SESSIONS) * 0.25) ** 0.5, 1)
        assert drawn == {s for s in SESSIONS if on_candidate(b"7:", "s" + s, share)}
        assert drawn == {s for s in SESSIONS if bucket(b"7:", "s" + s) < share}
        previous = drawn
    assert _drawn(_canary(0)) == set() and _drawn(_canary(100)) == set(SESSIONS)


def test_the_bound_is_exact() -> None:
    assert share_threshold(50) == bytes([0x80, 0, 0, 0, 0, 0, 0, 0])
    assert share_threshold(0) == bytes(8)
    # 5% of 2**64 is 922337203685477580.8: 922337203685477580 is inside, ...581 is not.
    assert int.from_bytes(share_threshold(5), "big") == 922337203685477581


def test_rollouts_draw_different_cohorts_and_keys_are_stable() -> None:
    first, second = _drawn(_canary(10, rollout_id=1)), _drawn(_canary(10, rollout_id=2))
    overlap = len(first & second) / len(first)
    assert 0.05 < overlap < 0.15  # independent cohorts overlap by about the share itself
    assert digest(b"1:", "sabc") == digest(b"1:", "sabc") != digest(b"2:", "sabc")


def test_stickiness_falls_back_to_the_tenant_and_then_to_chance() -> None:
    by_session = _canary(30)
    by_tenant = _canary(30, sticky_by="tenant")
    # Sticky by tenant: every session of one tenant lands on one side.
    for tenant in range(50):
        assert len({draw(by_tenant, s, tenant) for s in SESSIONS[:20]}) == 1
    # Sticky by session without a session header: the tenant decides.
    assert {draw(by_session, None, 3) for _ in range(20)} == {on_candidate(b"7:", "t3", 30)}
    # No key at all: chance, at the share.
    hits = sum(draw(by_session, None, None) for _ in range(20_000))
    assert 5_400 < hits < 6_600
