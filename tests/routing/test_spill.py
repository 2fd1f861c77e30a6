"""Spill: a rule's short requests overflow onto the long-context pool only while it has headroom and the
short pool is busier, and long requests never lose their place there (routing.proxy.spill)."""

from __future__ import annotations

import pytest

from routing.proxy.app import Proxy, RequestContext
from routing.proxy.config import (
    Endpoint,
    KeyInfo,
    Limits,
    Policy,
    Pool,
    RoutingSnapshot,
    Rule,
    parse_rule,
    policy_spills,
)
from routing.proxy.scorers import EndpointLoad
from routing.proxy.spill import Spill, decide, has_headroom, parse_spill

SPILL = Spill(pool="long", max_inflight=3, max_kv_used=0.5, min_home_inflight=1)


def loads(*inflight: int, kv_free: int | None = None, kv_total: int | None = None) -> list[EndpointLoad]:
    return [
        EndpointLoad(endpoint_id=str(i), inflight=n, kv_free_tokens=kv_free, kv_total_tokens=kv_total)
        for i, n in enumerate(inflight)
    ]


def test_stays_home_while_the_home_pool_has_an_idle_endpoint() -> None:
    assert decide(SPILL, loads(0, 5), loads(0), 300) is None


def test_spills_to_a_less_loaded_long_endpoint_when_every_short_one_is_busy() -> None:
    decision = decide(SPILL, loads(2, 4), loads(1, 0), 300)
    assert decision is not None
    indexes, why = decision
    assert indexes == [0, 1] and why == "spill long home_inflight=2"


def test_never_spills_onto_an_endpoint_as_loaded_as_the_home_pool() -> None:
    assert decide(SPILL, loads(2, 2), loads(2), 300) is None
    # Only the long endpoints less loaded than the least-loaded short one are offered.
    decision = decide(SPILL, loads(2, 2), loads(2, 1), 300)
    assert decision is not None and decision[0] == [1]


def test_the_in_flight_cap_leaves_room_for_long_requests() -> None:
    # The short pool is far busier, but the long endpoint already has max_inflight requests.
    assert decide(SPILL, loads(20, 20), loads(3), 300) is None
    decision = decide(SPILL, loads(20, 20), loads(3, 2), 300)
    assert decision is not None and decision[0] == [1]


def test_the_kv_cap_counts_the_request_itself() -> None:
    total = 100_000
    # 49,000 used + 1,000 needed = 50%: allowed; 1,001 more tokens is over.
    assert has_headroom(SPILL, loads(0, kv_free=51_000, kv_total=total)[0], 1_000)
    assert not has_headroom(SPILL, loads(0, kv_free=51_000, kv_total=total)[0], 1_001)
    assert decide(SPILL, loads(4), loads(0, kv_free=40_000, kv_total=total), 300) is None
    # Stale or missing KV state: the in-flight cap alone decides.
    assert has_headroom(SPILL, loads(2)[0], 10**9)


def test_min_home_inflight_zero_spills_to_an_idle_long_endpoint_only() -> None:
    eager = Spill(pool="long", max_inflight=3, max_kv_used=1.0, min_home_inflight=0)
    # Nothing is "less loaded" than an idle short endpoint, so even an eager spill stays home then.
    assert decide(eager, loads(0), loads(0), 10) is None


def test_parse_spill_and_rules() -> None:
    assert parse_spill(None) is None
    assert parse_spill({"pool": "long"}) == Spill(pool="long")
    assert parse_spill(
        {"pool": "long", "max_inflight": 2, "max_kv_used": 1, "min_home_inflight": 0}
    ) == Spill(pool="long", max_inflight=2, max_kv_used=1.0, min_home_inflight=0)
    for bad, message in (
        ("long", "must be an object"),
        ({}, "needs a 'pool'"),
        ({"pool": "long", "max_inflight": 0}, "max_inflight"),
        ({"pool": "long", "max_inflight": True}, "max_inflight"),
        ({"pool": "long", "max_kv_used": 1.5}, "max_kv_used"),
        ({"pool": "long", "min_home_inflight": -1}, "min_home_inflight"),
        ({"pool": "long", "cap": 3}, "unknown spill keys"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_spill(bad)
    with pytest.raises(ValueError, match="own pool"):
        parse_rule({"pool": "fast", "spill": {"pool": "fast"}})
    rule = parse_rule({"match": {"max_prompt_tokens": 6000}, "pool": "fast", "spill": {"pool": "long"}})
    assert rule.spill == Spill(pool="long")
    # The first rule naming a pool with a spill sets that pool's spill.
    assert policy_spills((Rule(pool="long"), rule, Rule(pool="fast", spill=Spill(pool="x")))) == {
        "fast": Spill(pool="long")
    }


# ---- in the proxy's route decision ------------------------------------------------------------------


def _endpoint(eid: str, max_len: int) -> Endpoint:
    return Endpoint(
        id=eid,
        deployment_id=None,
        base_url=f"http://127.0.0.1:1/{eid}",
        api_key="",
        served_model_name="m",
        max_model_len=max_len,
        block_size=16,
    )


@pytest.fixture
def chain() -> Proxy:
    """The demo's chain: short prompts to `fast` (two 8k engines) spilling onto `long` (one 64k engine)."""
    fast = Pool(name="fast", alias="m", endpoints=[_endpoint("f0", 8192), _endpoint("f1", 8192)])
    long = Pool(name="long", alias="m", scorer="best_fit", endpoints=[_endpoint("l0", 65536)])
    rules = (
        Rule(pool="long", tasks=frozenset({"summarize"})),
        Rule(pool="fast", max_prompt_tokens=6000, spill=SPILL),
    )
    policy = Policy(
        name="p",
        alias="m",
        rules=rules,
        default_pool="long",
        fallback_pool="long",
        spills=policy_spills(rules),
    )
    proxy = Proxy()
    proxy.snapshot = RoutingSnapshot(
        pools={"fast": fast, "long": long}, policies={"m": policy}, aliases=("m",)
    )
    return proxy


def _route(proxy: Proxy, prompt_tokens: int) -> tuple[str, str, list[str]]:
    key = KeyInfo(1, "k", "h", 1, "t", True, False, frozenset(), None, False, Limits(), Limits())
    ctx = RequestContext(request_id="r", kind="chat", started=0.0, key=key, prompt_tokens=prompt_tokens)
    scope = {"type": "http", "headers": []}
    policy = proxy.snapshot.policies["m"]
    pool, reason, candidates = proxy._route(ctx, scope, policy, "m", prompt_tokens, 128)
    return pool.name, reason, [ep.id for ep in candidates]


def _set_inflight(proxy: Proxy, **inflight: int) -> None:
    for pool in proxy.snapshot.pools.values():
        for ep in pool.endpoints:
            proxy._state(ep).inflight = inflight.get(ep.id, 0)


def test_short_requests_stay_on_the_fast_pool_while_it_has_an_idle_engine(chain: Proxy) -> None:
    _set_inflight(chain, f0=3, f1=0)
    assert _route(chain, 300) == ("fast", "policy p rule 2", ["f0", "f1"])


def test_short_requests_spill_onto_the_long_pool_when_the_fast_pool_is_busier(chain: Proxy) -> None:
    _set_inflight(chain, f0=2, f1=2, l0=1)
    pool, reason, candidates = _route(chain, 300)
    assert (pool, candidates) == ("long", ["l0"])
    assert reason == "policy p rule 2; spill long home_inflight=2"


def test_spill_stops_at_the_cap_and_long_requests_keep_their_place(chain: Proxy) -> None:
    # The long engine holds max_inflight (3) requests: short ones stay on the busy fast pool ...
    _set_inflight(chain, f0=9, f1=9, l0=3)
    assert _route(chain, 300)[0] == "fast"
    # ... and a long prompt still goes to the long pool, by its own rule (the default), never elsewhere.
    assert _route(chain, 7000) == ("long", "policy p default", ["l0"])
    _set_inflight(chain, f0=0, f1=0, l0=40)
    assert _route(chain, 7000) == ("long", "policy p default", ["l0"])


def test_a_policy_without_spill_never_spills(chain: Proxy) -> None:
    policy = chain.snapshot.policies["m"]
    chain.snapshot.policies["m"] = Policy(
        name=policy.name,
        alias=policy.alias,
        rules=policy.rules,
        default_pool=policy.default_pool,
        fallback_pool=policy.fallback_pool,
    )
    _set_inflight(chain, f0=5, f1=5, l0=0)
    assert _route(chain, 300)[0] == "fast"
