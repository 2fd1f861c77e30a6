"""Canaries judged on real traffic: the official `openai` client through a proxy to simulator engines.

The candidate's requests reach it through the proxy like any request: a route pool pinned to the
candidate version and a policy rule (header `x-task: canary`) send the canary's share there, the rest
goes to the alias's pool (the active version, plus the share the proxy's own canary draw sends to the
candidate where it runs; the gate counts each request by the version that answered it). The proxy's
request log, which names the version that answered, is what the gate task reads. A candidate made
erroneous (`--sim-error-rate`) or slow (a simulator 10x slower than the baseline's) is rolled back by
the beat task's function; a healthy one advances step by step to 100% and becomes the alias's active
version, which new requests without the header then reach.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import openai
import pytest

from models_registry.models import ModelAlias, ModelVersion
from routing.models import RequestLog, Rollout, RoutePolicy, RoutePool
from routing.rollouts import services
from routing.rollouts.history import format_history
from routing.tasks import evaluate_rollouts_task
from tests.routing.conftest import Proc, make_tenant_key
from tests.routing.fleet import FleetMember, ensure_alias, start_member
from tests.routing.rollouts import new_version

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ALIAS = "llama-rt"


@dataclass
class Live:
    alias: ModelAlias
    v1: ModelVersion
    v2: ModelVersion
    client: openai.OpenAI
    members: list[FleetMember]


@pytest.fixture
def live(
    request: pytest.FixtureRequest, start_proxy: Callable[..., Proc], redis_clean: None
) -> Iterator[Live]:
    """v1 healthy and active; v2 started with the candidate's simulator arguments (the test's param)."""
    candidate_args, baseline_scale, candidate_scale = request.param
    alias = ensure_alias(ALIAS)
    v1 = alias.active_version
    v2 = new_version(alias, "v2")
    members = [
        start_member(ALIAS, version=v1, time_scale=baseline_scale),
        start_member(ALIAS, *candidate_args, version=v2, time_scale=candidate_scale),
    ]
    pinned = RoutePool.objects.create(name="llama-rt-candidate", alias=ALIAS, model_version=v2)
    RoutePolicy.objects.create(
        name="llama-rt", alias=ALIAS, rules=[{"match": {"task": "canary"}, "pool": pinned.name}]
    )
    tk = make_tenant_key("acme")
    client = openai.OpenAI(base_url=start_proxy().url + "/v1", api_key=tk.raw_key, max_retries=0, timeout=30)
    yield Live(alias, v1, v2, client, members)
    for member in members:
        member.sim.stop()


def ask(client: openai.OpenAI, canary: bool) -> str:
    """One streamed chat request (so TTFT is logged); returns the proxy's request id, whatever the status."""
    # A session of its own per request: once the proxy draws the canary's share from the alias's pool by
    # session (else by tenant, and this test has one tenant), the un-pinned requests spread over both arms.
    headers = {"x-task": "canary"} if canary else {"x-session-id": secrets.token_hex(8)}
    try:
        raw = client.chat.completions.with_raw_response.create(
            model=ALIAS,
            messages=[{"role": "user", "content": "hello there"}],
            max_tokens=12,
            stream=True,
            extra_body={"ignore_eos": True},
            extra_headers=headers,
        )
        for _ in raw.parse():
            pass
        return raw.headers["x-request-id"]
    except openai.APIStatusError as exc:
        return exc.response.headers["x-request-id"]


def drive(live: Live, share: float, candidate: int) -> None:
    """`candidate` requests to the candidate, and to the baseline as many as the share implies (20 to 60)."""
    baseline = min(60, max(20, round(candidate * (100 - share) / share)))
    # Interleaved evenly, so both sides see the same moments of a busy test machine.
    total = candidate + baseline
    order = [(n + 1) * candidate // total > n * candidate // total for n in range(total)]
    ids = [ask(live.client, canary) for canary in order]
    deadline = time.monotonic() + 10
    while RequestLog.objects.filter(request_id__in=ids).count() < len(ids):
        assert time.monotonic() < deadline, "the proxy did not log every request"
        time.sleep(0.1)


def start(live: Live, **gates: float) -> Rollout:
    """Warm both engines and connections first (outside the step's window), then start the canary."""
    for _ in range(3):
        ask(live.client, True)
        ask(live.client, False)
    return services.start_rollout(
        live.alias, live.v2, [10, 50, 100], actor=None, gates=gates, min_step_seconds=0, min_step_requests=15
    )


@pytest.mark.parametrize("live", [(("--sim-error-rate", "0.5"), 50.0, 50.0)], indirect=True)
def test_an_erroneous_candidate_is_rolled_back_by_the_gate_task(live: Live) -> None:
    rollout = start(live, max_error_rate_delta=0.05)
    drive(live, rollout.share, 20)
    candidate_rows = RequestLog.objects.filter(model_version_id=live.v2.pk)
    # The simulator's 500 reaches the client of a stream as the proxy's 502 (the engine failed it).
    assert candidate_rows.filter(status__gte=500).exists() and candidate_rows.filter(status=200).exists()

    assert evaluate_rollouts_task() == {str(rollout.pk): "rollback"}
    rollout.refresh_from_db()
    assert (rollout.state, rollout.share) == ("rolled_back", 0.0)
    assert rollout.reason.startswith("Gate failed: max_error_rate_delta = ")
    last = rollout.decisions.last()
    assert last is not None and last.numbers["candidate"]["errors"] >= 3
    assert last.numbers["baseline"]["errors"] == 0 and last.numbers["baseline"]["requests"] >= 20
    live.alias.refresh_from_db()
    assert live.alias.active_version == live.v1


# Both engines slow enough that the modelled time, not the test machine's noise, sets the latency.
@pytest.mark.parametrize("live", [((), 5.0, 0.5)], indirect=True)
def test_a_slow_candidate_is_rolled_back_by_the_gate_task(live: Live) -> None:
    rollout = start(live, max_error_rate_delta=0.05, max_p95_latency_ratio=2.0, max_ttft_p95_ratio=3.0)
    drive(live, rollout.share, 16)
    assert evaluate_rollouts_task() == {str(rollout.pk): "rollback"}
    rollout.refresh_from_db()
    assert rollout.state == "rolled_back"
    assert "max_p95_latency_ratio = " in rollout.reason
    numbers = rollout.decisions.last().numbers  # type: ignore[union-attr]
    assert numbers["candidate"]["p95_latency_ms"] > 2 * numbers["baseline"]["p95_latency_ms"]
    assert numbers["gates"]["max_error_rate_delta"]["passed"] is True


@pytest.mark.parametrize("live", [((), 5.0, 5.0)], indirect=True)
def test_a_healthy_candidate_advances_to_100_and_becomes_the_active_version(live: Live) -> None:
    # p95 over 40 candidate requests is not one outlier of a busy test machine; TTFT is a few ms here
    # (short prompts), so its ratio gets more room than latency's.
    rollout = start(live, max_error_rate_delta=0.05, max_p95_latency_ratio=2.0, max_ttft_p95_ratio=5.0)
    verdicts = []
    for _ in range(3):
        rollout.refresh_from_db()
        if not rollout.active:
            break
        drive(live, rollout.share, 40)
        verdicts.append(evaluate_rollouts_task()[str(rollout.pk)])
    assert verdicts == ["advance", "promote"], [d.reason for d in rollout.decisions.all()]
    rollout.refresh_from_db()
    assert (rollout.state, rollout.share) == ("promoted", 100.0)
    assert [d.action for d in rollout.decisions.all()] == ["start", "advance", "promote"]
    print(format_history(rollout))  # what `manage.py rollout_history` prints, for a run with -s
    live.alias.refresh_from_db()
    assert live.alias.active_version == live.v2

    # New requests without the canary header now reach v2 through the alias's own pool.
    time.sleep(1.0)
    ids = [ask(live.client, False) for _ in range(5)]
    deadline = time.monotonic() + 10
    while RequestLog.objects.filter(request_id__in=ids).count() < 5:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert set(RequestLog.objects.filter(request_id__in=ids).values_list("model_version_id", flat=True)) == {
        live.v2.pk
    }
