"""Shadow traffic, through the official `openai` client against simulator engines.

The alias's active version answers; a ShadowConfig mirrors consenting tenants' requests to a
candidate version after the answer is out. The client's answer, status and latency are the same with
the mirror on as off, whether the candidate is healthy, slow, failing or down; pairs are stored and
scored with the evaluation metrics; tenants without consent are never mirrored; mirrors are never
charged to the tenant's quota and write no request-log row.
"""

from __future__ import annotations

import datetime as dt
import statistics
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest
from django.db.models import QuerySet
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from core.redis_client import get_redis
from core.redis_client import key as rkey
from models_registry.models import ModelAlias, ModelVersion
from routing.models import RequestLog, ShadowConfig, ShadowPair
from routing.proxy.config import Endpoint, Shadow
from routing.proxy.health import EndpointState
from routing.proxy.shadow import MirrorJob, ShadowMirror, score_pair, write_pairs
from routing.proxy.upstream import UpstreamPool
from tests.routing.conftest import Proc, TenantKey, make_tenant_key
from tests.routing.fleet import FleetMember, ensure_alias, start_member

ALIAS = "llama-shadow"
RELOAD_S = 1.0
PROMPTS = [f"Tell me about topic number {i}." for i in range(8)]


@dataclass
class Fleet:
    alias: ModelAlias
    v1: ModelVersion
    v2: ModelVersion
    primary: FleetMember
    candidate: FleetMember
    config: ShadowConfig


def _fleet(*candidate_args: str, candidate_time_scale: float = 200.0, **config: object) -> Fleet:
    alias = ensure_alias(ALIAS)
    v1 = alias.active_version
    v2 = ModelVersion.objects.create(
        model=v1.model, revision="v2", source_kind="directory", source_path="/models/llama-v2"
    )
    primary = start_member(ALIAS, version=v1, time_scale=200.0)
    candidate = start_member(ALIAS, *candidate_args, version=v2, time_scale=candidate_time_scale)
    shadow = ShadowConfig.objects.create(alias=alias, candidate_version=v2, percent=100, **config)
    return Fleet(alias, v1, v2, primary, candidate, shadow)


@pytest.fixture
def fleets(transactional_db: None, redis_clean: None) -> Iterator[Callable[..., Fleet]]:
    made: list[Fleet] = []

    def make(*args: str, **kwargs: object) -> Fleet:
        made.append(_fleet(*args, **kwargs))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for fleet in made:
        fleet.primary.sim.stop()
        fleet.candidate.sim.stop()


def _consenting(name: str = "consents", **limits: int) -> TenantKey:
    tk = make_tenant_key(name, None, **limits)
    tk.tenant.shadow_consent = True
    tk.tenant.save()
    return tk


@dataclass
class Answer:
    request_id: str
    status: int
    text: str
    seconds: float


def _ask(client: openai.OpenAI, prompt: str, stream: bool) -> Answer:
    started = time.perf_counter()
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": prompt}]
    if stream:
        raw = client.chat.completions.with_raw_response.create(
            model=ALIAS, messages=messages, max_tokens=16, temperature=0, stream=True
        )
        text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
        return Answer(raw.headers["x-request-id"], raw.status_code, text, time.perf_counter() - started)
    reply = client.chat.completions.with_raw_response.create(
        model=ALIAS, messages=messages, max_tokens=16, temperature=0
    )
    content = reply.parse().choices[0].message.content or ""
    return Answer(reply.headers["x-request-id"], reply.status_code, content, time.perf_counter() - started)


def _ask_all(client: openai.OpenAI) -> list[Answer]:
    return [_ask(client, prompt, stream=n % 2 == 1) for n, prompt in enumerate(PROMPTS)]


def _client(proxy: Proc, tk: TenantKey) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0, timeout=30)


def _at_least(query: QuerySet[Any], expect: int, timeout: float = 15.0) -> list[Any]:
    """The query's rows once there are `expect` of them (or at the deadline): shadow pairs are written
    after the mirror, request-log rows in the writer's batches, both behind the client's answer."""
    deadline = time.monotonic() + timeout
    while True:
        rows = list(query.all())  # .all(): a fresh query each time, not the first one's cache
        if len(rows) >= expect or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)


def _pairs(request_ids: list[str], expect: int, timeout: float = 15.0) -> list[ShadowPair]:
    return _at_least(ShadowPair.objects.filter(request_id__in=request_ids).order_by("id"), expect, timeout)


def _metric(proxy: Proc, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = urllib.request.urlopen(proxy.url + "/metrics", timeout=5).read().decode()
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


@pytest.mark.django_db(transaction=True)
def test_pairs_are_stored_and_scored_for_consenting_tenants_only_and_never_charged(
    start_proxy: Callable[..., Proc], fleets: Callable[..., Fleet]
) -> None:
    # The candidate is a drifted twin: its greedy answers part from the primary's somewhere.
    fleet = fleets("--sim-quality-drift", "0.5")
    yes = _consenting(daily_token_budget=10_000_000, requests_per_minute=10_000)
    no = make_tenant_key("declines", daily_token_budget=10_000_000)
    proxy = start_proxy()

    answers = _ask_all(_client(proxy, yes))
    declined = _ask_all(_client(proxy, no))
    assert {a.status for a in answers + declined} == {200}
    pairs = _pairs([a.request_id for a in answers], len(answers))
    assert [p.request_id for p in pairs] == [a.request_id for a in answers]

    for answer, pair in zip(answers, pairs, strict=True):
        assert pair.tenant_id == yes.tenant.pk and pair.alias == ALIAS and pair.endpoint_kind == "chat"
        assert (pair.primary_version_id, pair.candidate_version_id) == (fleet.v1.pk, fleet.v2.pk)
        assert pair.primary_output == answer.text  # what the client got, streamed or not
        assert pair.candidate_status == 200 and pair.candidate_error == "" and pair.candidate_output
        assert pair.request["messages"][0]["content"] in PROMPTS
        expected = score_pair(pair.primary_output, pair.candidate_output)
        assert pair.scores == expected
        assert (pair.exact_match, pair.first_divergence, pair.chrf) == (
            expected["exact_match"],
            expected["first_divergence"],
            expected["chrf"],
        )
        assert pair.primary_latency_ms and pair.candidate_latency_ms
    assert any(not p.exact_match for p in pairs), "a drifted twin should disagree somewhere"

    # Tenants without consent are never mirrored (give a straggler the time to show up).
    time.sleep(1.0)
    assert not ShadowPair.objects.filter(tenant_id=no.tenant.pk).exists()
    assert ShadowPair.objects.count() == len(answers)

    # No request-log row for a mirror, and the quota counted only the client's own requests.
    rows = RequestLog.objects.filter(tenant_id=yes.tenant.pk)
    assert len(_at_least(rows, len(answers))) == len(answers)
    assert set(rows.values_list("model_version_id", flat=True)) == {fleet.v1.pk}
    used = sum((r.prompt_tokens or 0) + (r.completion_tokens or 0) for r in rows)
    day = dt.datetime.now(dt.UTC).strftime("%Y%m%d")
    redis = get_redis()
    assert int(redis.get(rkey("rl", f"t{yes.tenant.pk}", "budget", day)) or 0) == used
    assert redis.zcard(rkey("rl", f"t{yes.tenant.pk}", "rpm")) == len(answers)

    mirrors = _metric(proxy, "inferchain_proxy_shadow_mirrors_total")
    assert mirrors == {(("alias", ALIAS), ("outcome", "ok"), ("version", str(fleet.v2))): len(answers)}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", ["slow", "failing", "down"])
def test_shadow_never_changes_the_clients_answer_status_or_latency(
    mode: str, start_proxy: Callable[..., Proc], fleets: Callable[..., Fleet]
) -> None:
    if mode == "slow":
        # A quarter of real time: 16 tokens take the candidate about 0.5 s (125 ms measured at real
        # time, against 6-10 ms for the client's slowest answer on a quiet machine); two mirrors at most.
        fleet = fleets(candidate_time_scale=0.25, enabled=False, max_inflight=2)
    elif mode == "failing":
        fleet = fleets("--sim-error-rate", "1.0", enabled=False)
    else:
        fleet = fleets(enabled=False)
        fleet.candidate.sim.stop()  # its deployment still says ready: the proxy finds out by trying
    tk = _consenting()
    proxy = start_proxy()
    client = _client(proxy, tk)

    off = _ask_all(client)
    fleet.config.enabled = True
    fleet.config.save()  # published to the proxy by the save signal
    time.sleep(RELOAD_S)
    on = _ask_all(client)
    off_again = _ask_all(client) if mode == "slow" else []

    assert [(a.status, a.text) for a in on] == [(a.status, a.text) for a in off]
    assert {a.status for a in on} == {200} and all(a.text for a in on)
    # Latency: the mirror starts after the answer is out, so the client's median does not move
    # (a generous bound for a shared test machine) and no answer waits for a slow candidate.
    before = statistics.median(a.seconds for a in off + off_again)
    assert statistics.median(a.seconds for a in on) < before * 2 + 0.05
    pairs = _pairs([a.request_id for a in on], 1)
    if mode == "slow":
        assert max(a.seconds for a in on) < 0.5
        pairs = _pairs([a.request_id for a in on], 2)
        # Every mirror took longer than every answer the client got: an answer that had waited for its
        # mirror would have taken at least as long. (At real time with a factor of 2 on top, 125 ms
        # against twice the slowest answer, it failed once in a loaded fresh-clone CI run.)
        slowest_ms = max(a.seconds for a in on) * 1000
        assert all(p.candidate_latency_ms and p.candidate_latency_ms > slowest_ms for p in pairs), (
            [p.candidate_latency_ms for p in pairs],
            slowest_ms,
        )
        skipped = _metric(proxy, "inferchain_proxy_shadow_skipped_total")
        assert skipped.get((("alias", ALIAS), ("reason", "max_inflight")), 0) >= 1
    elif mode == "failing":
        pairs = _pairs([a.request_id for a in on], len(on))
        assert {p.candidate_status for p in pairs} == {500}
        assert all(p.chrf is None and p.exact_match is None for p in pairs)
    else:
        pairs = _pairs([a.request_id for a in on], len(on))
        assert {p.candidate_status for p in pairs} == {None}
        assert all("Error" in p.candidate_error for p in pairs), [p.candidate_error for p in pairs]
    assert pairs
    # Every client request has its row once the writer's batches are in (CI once counted before the
    # last two batches landed); a mirror would add one, written by the same batches.
    logged = RequestLog.objects.filter(tenant_id=tk.tenant.pk)
    asked = len(off) + len(on) + len(off_again)
    _at_least(logged, asked)
    time.sleep(1.0)  # one more flush for a straggler
    assert logged.count() == asked


# ---- the mirror's own decisions, without processes ------------------------------------------------


def _endpoint(n: int) -> Endpoint:
    return Endpoint(
        id=f"e{n}",
        deployment_id=n,
        base_url=f"http://127.0.0.1:{9000 + n}",
        api_key="",
        served_model_name=ALIAS,
        max_model_len=4096,
        block_size=16,
        version_id=2,
    )


def _job(shadow: Shadow, room: float = 8) -> MirrorJob:
    return MirrorJob(
        shadow=shadow,
        request_id="r",
        kind="chat",
        tenant_id=1,
        body={"model": ALIAS, "messages": [{"role": "user", "content": "hi"}]},
        primary_version_id=1,
        primary_output="hello",
        primary_latency_ms=1.0,
        room_per_endpoint=room,
    )


def test_the_mirror_is_skipped_for_each_reason_and_sent_to_the_least_busy_candidate() -> None:
    eps = [_endpoint(1), _endpoint(2)]
    shadow = Shadow(
        config_id=1, alias=ALIAS, version_id=2, percent=10, max_inflight=2, timeout_s=5, endpoints=eps
    )
    states = {ep.id: EndpointState(ep.id) for ep in eps}
    mirror = ShadowMirror(UpstreamPool(), states, None)
    reasons: list[str] = []
    mirror._skip = lambda alias, reason: reasons.append(reason)  # type: ignore[method-assign]

    states["e1"].inflight = 3
    assert mirror.pick(_job(shadow)) is eps[1]
    states["e2"].inflight = 8
    assert mirror.pick(_job(shadow)) is eps[0]
    states["e1"].inflight = 8
    assert mirror.pick(_job(shadow, room=8)) is None  # every candidate as busy as batch may make it
    states["e1"].open_until = states["e2"].open_until = time.monotonic() + 10
    assert mirror.pick(_job(shadow)) is None  # both ejected by their circuit breakers
    mirror.inflight[1] = 2
    assert mirror.pick(_job(shadow)) is None  # this process has max_inflight mirrors out
    assert mirror.pick(_job(Shadow(2, ALIAS, 2, 10, 2, 5, endpoints=[]))) is None
    assert reasons == ["saturated", "unavailable", "max_inflight", "no_endpoint"]


@pytest.mark.django_db
def test_pairs_are_scored_when_written_and_failed_mirrors_are_kept_unscored() -> None:
    base = {
        "alias": ALIAS,
        "request": {"messages": [{"role": "user", "content": "a\x00b"}]},
        "primary_output": "one two three",
    }
    write_pairs(
        [
            {**base, "request_id": "same", "candidate_output": "one two three", "candidate_status": 200},
            {**base, "request_id": "parts", "candidate_output": "one two four", "candidate_status": 200},
            {**base, "request_id": "failed", "candidate_status": 500, "candidate_error": "boom"},
            # As replayed from the spool: the time is a string.
            {
                **base,
                "request_id": "spooled",
                "created_at": "2026-11-30T10:00:00+00:00",
                "candidate_status": None,
            },
        ]
    )
    pairs = {p.request_id: p for p in ShadowPair.objects.all()}
    assert (pairs["same"].exact_match, pairs["same"].first_divergence, pairs["same"].chrf) == (
        True,
        None,
        100.0,
    )
    assert (pairs["parts"].exact_match, pairs["parts"].first_divergence) == (False, 2)
    assert pairs["parts"].chrf is not None and 0 < pairs["parts"].chrf < 100
    assert (
        pairs["failed"].chrf is None
        and pairs["failed"].scores == {}
        and pairs["failed"].candidate_error == "boom"
    )
    assert pairs["spooled"].created_at == dt.datetime(2026, 11, 30, 10, tzinfo=dt.UTC)
    assert pairs["same"].request["messages"][0]["content"] == "a\ufffdb"
