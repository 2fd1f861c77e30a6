"""The canary draw, through the official `openai` client against simulator engines.

Two versions of one model, each with a ready simulator deployment under the same served name, and a
Rollout of the second at some share: that share of the requests (by session) goes to the candidate,
within a binomial bound and exactly the sessions the hash puts below the share; a session stays on its
version while the share rises; share 0 and a rolled-back rollout send nothing to the candidate; a
candidate without a ready (or reachable) endpoint leaves its draws to the baseline, never an error.
The request log says which version answered each request.
"""

from __future__ import annotations

import asyncio
import math
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from models_registry.models import ModelAlias, ModelVersion
from routing.models import RequestLog, Rollout, RolloutState, StickyBy
from routing.proxy import canary
from routing.proxy.config import load_routing_snapshot
from tests.routing.conftest import Proc, make_tenant_key
from tests.routing.fleet import FleetMember, ensure_alias, start_member

pytestmark = pytest.mark.django_db(transaction=True)

ALIAS = "llama-canary"
RELOAD_WITHIN_S = 1.0


@dataclass
class Fleet:
    alias: ModelAlias
    v1: ModelVersion
    v2: ModelVersion
    on_v1: FleetMember
    on_v2: FleetMember


@pytest.fixture
def fleet(transactional_db: None, redis_clean: None) -> Iterator[Fleet]:
    alias = ensure_alias(ALIAS)
    v1 = alias.active_version
    v2 = ModelVersion.objects.create(
        model=v1.model, revision="v2", source_kind="directory", source_path="/models/llama-v2"
    )
    on_v1 = start_member(ALIAS, version=v1, time_scale=200.0)
    on_v2 = start_member(ALIAS, version=v2, time_scale=200.0)
    yield Fleet(alias, v1, v2, on_v1, on_v2)
    for member in (on_v1, on_v2):
        member.sim.stop()


def _rollout(
    fleet: Fleet, share: float, candidate: ModelVersion | None = None, sticky_by: str = StickyBy.SESSION
) -> Rollout:
    return Rollout.objects.create(
        alias=fleet.alias,
        baseline_version=fleet.v1,
        candidate_version=candidate or fleet.v2,
        steps=[1, 5, 25, 50, 100],
        step_index=1,
        share=share,
        sticky_by=sticky_by,
    )


def scrape(proxy: Proc) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The proxy's /metrics as {sample name: [(labels, value)]}."""
    text = urllib.request.urlopen(proxy.url + "/metrics", timeout=5).read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def _client(proxy: Proc, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0, timeout=30)


def _ask(client: openai.OpenAI, session: str | None = None) -> str:
    """One one-token chat request (with a session header if given); returns the proxy's request id."""
    raw = client.chat.completions.with_raw_response.create(
        model=ALIAS,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=1,
        extra_headers={"x-session-id": session} if session else None,
    )
    assert raw.http_response.status_code == 200
    assert raw.parse().choices, raw.text
    return raw.headers["x-request-id"]


def _ask_all(proxy: Proc, key: str, sessions: list[str]) -> list[str]:
    """One one-token chat request per session, 16 at a time (the async client); the request ids."""

    async def run() -> list[str]:
        client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0, timeout=30)
        gate = asyncio.Semaphore(16)

        async def one(session: str) -> str:
            async with gate:
                raw = await client.chat.completions.with_raw_response.create(
                    model=ALIAS,
                    messages=[{"role": "user", "content": "hi"}],
                    max_tokens=1,
                    extra_headers={"x-session-id": session},
                )
            assert raw.http_response.status_code == 200, raw.text
            return raw.headers["x-request-id"]

        try:
            return await asyncio.gather(*(one(s) for s in sessions))
        finally:
            await client.close()

    return asyncio.run(run())


def _versions(request_ids: list[str], timeout: float = 15.0) -> list[int | None]:
    """The model version that answered each request, from the request log (in request order)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = dict(
            RequestLog.objects.filter(request_id__in=request_ids).values_list(
                "request_id", "model_version_id"
            )
        )
        if len(rows) == len(set(request_ids)) or time.monotonic() > deadline:
            assert len(rows) == len(set(request_ids)), "request-log rows missing"
            return [rows[r] for r in request_ids]
        time.sleep(0.1)


def _reloaded(client: openai.OpenAI, session: str, version: int) -> float:
    """Seconds from now until `session` is answered by `version` (the proxy reloaded the rollout) and
    stays there: requests go out every 20 ms for RELOAD_WITHIN_S + 0.5 s, then the log is read."""
    started = time.monotonic()
    sent: list[tuple[float, str]] = []
    while time.monotonic() - started < RELOAD_WITHIN_S + 0.5:
        sent.append((time.monotonic() - started, _ask(client, session)))
        time.sleep(0.02)
    versions = _versions([rid for _, rid in sent])
    assert version in versions, "the rollout change did not arrive"
    moved = versions.index(version)
    assert set(versions[moved:]) == {version}, versions
    return sent[moved][0]


def test_snapshot_carries_the_active_rollout_with_the_candidate_endpoints(fleet: Fleet) -> None:
    rollout = _rollout(fleet, 5)
    pooled = load_routing_snapshot().pools[ALIAS].canary
    assert pooled is not None
    assert (pooled.rollout_id, pooled.version_id, pooled.share) == (rollout.pk, fleet.v2.pk, 5.0)
    assert [ep.deployment_id for ep in pooled.endpoints] == [fleet.on_v2.deployment.pk]
    for state in (RolloutState.PROMOTED, RolloutState.ROLLED_BACK, RolloutState.CANCELLED):
        Rollout.objects.filter(pk=rollout.pk).update(state=state)
        assert load_routing_snapshot().pools[ALIAS].canary is None, state


def test_a_five_percent_canary_gets_five_percent_of_sessions(
    start_proxy: Callable[..., Proc], fleet: Fleet
) -> None:
    rollout = _rollout(fleet, 5)
    tk = make_tenant_key("acme")
    proxy = start_proxy()
    n = 2000
    sessions = [f"conversation-{i}" for i in range(n)]
    started = time.monotonic()
    versions = _versions(_ask_all(proxy, tk.raw_key, sessions))
    elapsed = time.monotonic() - started

    drawn = {s for s, v in zip(sessions, versions, strict=True) if v == fleet.v2.pk}
    assert set(versions) == {fleet.v1.pk, fleet.v2.pk}
    # Binomial(2000, 0.05): mean 100, sd 9.7; 4 sd either side fails about once in 16,000 runs.
    sd = math.sqrt(n * 0.05 * 0.95)
    assert abs(len(drawn) - n * 0.05) <= 4 * sd, len(drawn)
    # And exactly the sessions the stable hash puts below the share: the draw is the hash, nothing else.
    salt = f"{rollout.pk}:".encode()
    assert drawn == {s for s in sessions if canary.on_candidate(salt, "s" + s, 5)}
    assert elapsed < 60, elapsed

    metrics = scrape(proxy)
    draws = {labels["outcome"]: value for labels, value in metrics["inferchain_proxy_canary_draws_total"]}
    assert draws == {"candidate": len(drawn), "baseline": n - len(drawn)}
    requests = {
        (labels["version"], labels["arm"], labels["code"]): value
        for labels, value in metrics["inferchain_proxy_version_requests_total"]
        if labels["alias"] == ALIAS
    }
    assert requests == {
        (str(fleet.v2), "canary", "2xx"): len(drawn),
        (str(fleet.v1), "primary", "2xx"): n - len(drawn),
    }
    latency = {
        (labels["version"], labels["arm"]): value
        for labels, value in metrics["inferchain_proxy_version_request_seconds_count"]
    }
    assert latency == {
        (str(fleet.v2), "canary"): len(drawn),
        (str(fleet.v1), "primary"): n - len(drawn),
    }


def test_sessions_stay_put_and_a_rising_share_only_moves_sessions_to_the_candidate(
    start_proxy: Callable[..., Proc], fleet: Fleet
) -> None:
    rollout = _rollout(fleet, 5)
    tk = make_tenant_key("acme")
    proxy = start_proxy()
    client = _client(proxy, tk.raw_key)
    sessions = [f"chat-{i}" for i in range(300)]
    first = _versions(_ask_all(proxy, tk.raw_key, sessions))
    again = _versions(_ask_all(proxy, tk.raw_key, sessions))
    assert first == again  # nobody bounced between versions at a constant share
    at_5 = {s for s, v in zip(sessions, first, strict=True) if v == fleet.v2.pk}
    assert at_5

    salt = f"{rollout.pk}:".encode()
    newcomer = next(
        s
        for s in sessions
        if canary.on_candidate(salt, "s" + s, 25) and not canary.on_candidate(salt, "s" + s, 5)
    )
    rollout.share = 25
    rollout.step_index = 2
    rollout.save()  # the signal publishes the change; the proxy reloads
    assert _reloaded(client, newcomer, fleet.v2.pk) <= RELOAD_WITHIN_S
    at_25_list = _versions(_ask_all(proxy, tk.raw_key, sessions))
    at_25 = {s for s, v in zip(sessions, at_25_list, strict=True) if v == fleet.v2.pk}
    assert at_5 < at_25  # every session on the candidate at 5% is still there; more joined
    assert len(at_25) > 2 * len(at_5)


def test_tenant_stickiness_puts_a_tenant_on_one_side(start_proxy: Callable[..., Proc], fleet: Fleet) -> None:
    rollout = _rollout(fleet, 50, sticky_by=StickyBy.TENANT)
    keys = [make_tenant_key(f"tenant-{i}") for i in range(12)]
    proxy = start_proxy()
    salt = f"{rollout.pk}:".encode()
    for tk in keys:
        # Session headers are ignored when the rollout is sticky by tenant.
        versions = set(_versions(_ask_all(proxy, tk.raw_key, [f"s{i}" for i in range(6)])))
        expected = fleet.v2.pk if canary.on_candidate(salt, f"t{tk.tenant.pk}", 50) else fleet.v1.pk
        assert versions == {expected}, tk.tenant.name


def test_share_zero_and_a_rolled_back_rollout_send_nothing_to_the_candidate(
    start_proxy: Callable[..., Proc], fleet: Fleet
) -> None:
    rollout = _rollout(fleet, 0)
    tk = make_tenant_key("acme")
    proxy = start_proxy()
    client = _client(proxy, tk.raw_key)
    sessions = [f"s{i}" for i in range(200)]
    assert set(_versions(_ask_all(proxy, tk.raw_key, sessions))) == {fleet.v1.pk}

    rollout.share = 100
    rollout.save()
    _reloaded(client, "s0", fleet.v2.pk)
    rollout.state = RolloutState.ROLLED_BACK
    rollout.share = 0
    rollout.save()
    time.sleep(RELOAD_WITHIN_S)
    assert set(_versions(_ask_all(proxy, tk.raw_key, sessions))) == {fleet.v1.pk}

    # A rolled-back rollout whose share was left above 0 is still no canary: state decides.
    Rollout.objects.filter(pk=rollout.pk).update(share=100)
    assert load_routing_snapshot().pools[ALIAS].canary is None


def test_a_candidate_without_a_ready_or_reachable_endpoint_leaves_its_draws_to_the_baseline(
    start_proxy: Callable[..., Proc], fleet: Fleet
) -> None:
    v3 = ModelVersion.objects.create(
        model=fleet.v1.model, revision="v3", source_kind="directory", source_path="/models/llama-v3"
    )
    rollout = _rollout(fleet, 100, candidate=v3)  # nobody runs v3
    tk = make_tenant_key("acme")
    proxy = start_proxy()
    client = _client(proxy, tk.raw_key)
    sessions = [f"s{i}" for i in range(40)]
    assert set(_versions(_ask_all(proxy, tk.raw_key, sessions))) == {fleet.v1.pk}  # every one a 200

    # v2 is "ready" in the database but its engine is gone (the agent has not noticed yet).
    fleet.on_v2.sim.stop()
    rollout.candidate_version = fleet.v2
    rollout.save()
    time.sleep(RELOAD_WITHIN_S)
    assert set(_versions([_ask(client, s) for s in sessions])) == {fleet.v1.pk}
    rows = RequestLog.objects.filter(route_reason__contains="canary candidate unreachable")
    assert rows.exists() and set(rows.values_list("status", flat=True)) == {200}
    outcomes = {labels["outcome"] for labels, _ in scrape(proxy)["inferchain_proxy_canary_draws_total"]}
    assert {"candidate_unavailable", "candidate_unreachable"} <= outcomes
