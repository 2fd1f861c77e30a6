"""Version-aware routing, through the official `openai` client against simulator engines.

Two versions of one model, each with a ready deployment under the same served name: the alias's traffic
goes only to its active version; a switch moves new requests on every proxy process within a second
(pub/sub reload) while a request already streaming finishes on the old version; the request log (and
its API) names the version that answered; an active version with no ready deployment is refused with
an OpenAI-shaped error naming it, never served by another version.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import openai
import pytest
from rest_framework.test import APIClient

from models_registry.models import Model, ModelAlias, ModelVersion
from routing.models import RequestLog
from routing.proxy.config import load_routing_snapshot
from tests.routing.conftest import Proc, make_tenant_key
from tests.routing.fleet import FleetMember, ensure_alias, start_member

pytestmark = pytest.mark.django_db(transaction=True)

ALIAS = "llama-vr"
SWITCH_WITHIN_S = 1.0


@dataclass
class TwoVersions:
    alias: ModelAlias
    v1: ModelVersion
    v2: ModelVersion
    on_v1: FleetMember
    on_v2: FleetMember


def _version(alias: ModelAlias, revision: str) -> ModelVersion:
    base = alias.active_version
    return ModelVersion.objects.create(
        model=base.model,
        revision=revision,
        source_kind="directory",
        source_path=f"/models/llama-{revision}",
        max_context=base.max_context,
    )


@pytest.fixture
def two_versions(transactional_db: None, redis_clean: None) -> Iterator[TwoVersions]:
    alias = ensure_alias(ALIAS)
    v1 = alias.active_version
    v2 = _version(alias, "v2")
    # Real time (time scale 1): a long answer takes seconds, so it is still streaming at the switch.
    on_v1 = start_member(ALIAS, version=v1, time_scale=1.0)
    on_v2 = start_member(ALIAS, version=v2, time_scale=1.0)
    yield TwoVersions(alias, v1, v2, on_v1, on_v2)
    for member in (on_v1, on_v2):
        member.sim.stop()


def _client(proxy: Proc, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0, timeout=30)


def _ask(client: openai.OpenAI) -> str:
    """One short chat request; returns the proxy's request id."""
    raw = client.chat.completions.with_raw_response.create(
        model=ALIAS, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert raw.parse().choices, raw.text
    return raw.headers["x-request-id"]


def _rows(request_ids: list[str], timeout: float = 10.0) -> dict[str, RequestLog]:
    deadline = time.monotonic() + timeout
    while True:
        rows = {r.request_id: r for r in RequestLog.objects.filter(request_id__in=request_ids)}
        if len(rows) == len(set(request_ids)) or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)


def _switch(admin_client: APIClient, alias: ModelAlias, version: ModelVersion) -> None:
    reply = admin_client.post(
        f"/api/model-aliases/{alias.pk}/switch/", {"version": version.pk}, format="json"
    )
    assert reply.status_code == 200, reply.json()


def test_snapshot_pools_hold_only_the_active_version(two_versions: TwoVersions) -> None:
    snap = load_routing_snapshot()
    pool = snap.pools[ALIAS]
    assert [ep.deployment_id for ep in pool.endpoints] == [two_versions.on_v1.deployment.pk]
    assert pool.version_id == two_versions.v1.pk
    assert {v: [ep.deployment_id for ep in eps] for v, eps in pool.staged.items()} == {
        two_versions.v2.pk: [two_versions.on_v2.deployment.pk]
    }


def test_a_pool_that_names_a_version_serves_it_whatever_the_active_one(
    two_versions: TwoVersions, admin_client: APIClient
) -> None:
    created = admin_client.post(
        "/api/route-pools/",
        {"name": "pinned", "alias": ALIAS, "model_version": two_versions.v2.pk},
        format="json",
    )
    assert created.status_code == 201, created.json()
    pools = load_routing_snapshot().pools
    assert [ep.deployment_id for ep in pools["pinned"].endpoints] == [two_versions.on_v2.deployment.pk]
    assert [ep.deployment_id for ep in pools[ALIAS].endpoints] == [two_versions.on_v1.deployment.pk]
    _switch(admin_client, two_versions.alias, two_versions.v2)
    _switch(admin_client, two_versions.alias, two_versions.v1)
    assert [ep.deployment_id for ep in load_routing_snapshot().pools["pinned"].endpoints] == [
        two_versions.on_v2.deployment.pk
    ]


def test_a_pool_cannot_name_a_version_of_another_model(
    two_versions: TwoVersions, admin_client: APIClient
) -> None:
    other = ModelVersion.objects.create(
        model=Model.objects.create(name="other-model"),
        revision="r1",
        source_kind="directory",
        source_path="/m",
    )
    reply = admin_client.post(
        "/api/route-pools/", {"name": "wrong", "alias": ALIAS, "model_version": other.pk}, format="json"
    )
    assert reply.status_code == 400
    assert "not a version of the model behind 'llama-vr'" in reply.json()["model_version"][0]


def test_switch_moves_new_traffic_on_every_proxy_and_in_flight_finishes_on_the_old_version(
    start_proxy: Callable[..., Proc], two_versions: TwoVersions, admin_client: APIClient
) -> None:
    tk = make_tenant_key("acme")
    proxies = [start_proxy(), start_proxy()]
    clients = [_client(p, tk.raw_key) for p in proxies]

    # Before: every request, on either proxy, is answered by v1.
    before = [_ask(clients[n % 2]) for n in range(10)]
    rows = _rows(before)
    assert {r.model_version_id for r in rows.values()} == {two_versions.v1.pk}
    assert {r.deployment_id for r in rows.values()} == {two_versions.on_v1.deployment.pk}

    # A long answer starts streaming from v1 before the switch.
    slow = clients[0].chat.completions.with_raw_response.create(
        model=ALIAS,
        messages=[{"role": "user", "content": "tell me a long story"}],
        max_tokens=300,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    slow_id = slow.headers["x-request-id"]
    stream = slow.parse()
    chunks = iter(stream)
    first = next(chunks)  # the engine is generating: the request is in flight on v1
    assert first.choices

    switched_at = time.monotonic()
    _switch(admin_client, two_versions.alias, two_versions.v2)
    after: list[tuple[float, str]] = []
    while time.monotonic() - switched_at < SWITCH_WITHIN_S + 0.5:
        client = clients[len(after) % 2]
        sent = time.monotonic() - switched_at
        after.append((sent, _ask(client)))

    # The in-flight stream finishes, complete, on v1 after the switch.
    rest = list(chunks)
    finish = [c.choices[0].finish_reason for c in rest if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"]
    assert time.monotonic() - switched_at > 0.2  # it really outlived the switch
    rows = _rows([rid for _, rid in after] + [slow_id])
    slow_row = rows[slow_id]
    assert slow_row.status == 200 and slow_row.completion_tokens == 300
    assert slow_row.model_version_id == two_versions.v1.pk
    assert slow_row.deployment_id == two_versions.on_v1.deployment.pk

    # After: every request sent a second or more after the switch, on both proxies, is answered by v2.
    late = [(n, rows[rid]) for n, (sent, rid) in enumerate(after) if sent >= SWITCH_WITHIN_S]
    assert {n % 2 for n, _ in late} == {0, 1}, "both proxies were asked after the switch"
    assert {r.model_version_id for _, r in late} == {two_versions.v2.pk}
    assert {r.deployment_id for _, r in late} == {two_versions.on_v2.deployment.pk}
    # ... and nothing answered by v2 before the switch, nothing by v1 once a proxy had moved.
    versions = [rows[rid].model_version_id for _, rid in after]
    for proxy in (0, 1):
        mine = versions[proxy::2]
        moved = mine.index(two_versions.v2.pk)
        assert set(mine[moved:]) == {two_versions.v2.pk}, mine


def test_request_log_api_names_the_version(
    start_proxy: Callable[..., Proc], two_versions: TwoVersions, admin_client: APIClient
) -> None:
    tk = make_tenant_key("acme")
    rid = _ask(_client(start_proxy(), tk.raw_key))
    _rows([rid])
    reply = admin_client.get("/api/request-log/", {"alias": ALIAS})
    assert reply.status_code == 200
    [row] = [r for r in reply.json()["results"] if r["request_id"] == rid]
    assert row["model_version_id"] == two_versions.v1.pk
    assert row["deployment_id"] == two_versions.on_v1.deployment.pk


def test_active_version_without_a_ready_deployment_is_refused_by_name(
    start_proxy: Callable[..., Proc], two_versions: TwoVersions, admin_client: APIClient
) -> None:
    tk = make_tenant_key("acme")
    client = _client(start_proxy(), tk.raw_key)
    _ask(client)
    v3 = _version(two_versions.alias, "v3")
    _switch(admin_client, two_versions.alias, v3)

    deadline = time.monotonic() + SWITCH_WITHIN_S + 1
    while True:
        try:
            _ask(client)
        except openai.InternalServerError as exc:
            err = exc
            break
        assert time.monotonic() < deadline, "still served after the switch to a version nobody runs"
        time.sleep(0.05)
    assert err.status_code == 503
    body = err.body
    assert isinstance(body, dict)
    assert body["code"] == "model_version_not_ready" and body["param"] == "model"
    assert body["type"] == "service_unavailable_error"
    message = body["message"]
    assert f"llama-3.1-8b@v3 (id {v3.pk})" in message
    assert "no ready deployment" in message
    assert f"llama-3.1-8b@main (id {two_versions.v1.pk})" in message  # the ready ones, not used
    assert f"llama-3.1-8b@v2 (id {two_versions.v2.pk})" in message
    assert "switch the alias" in message
    # Nothing went to the other versions meanwhile: the refused requests are logged without an engine.
    time.sleep(0.6)
    refused = RequestLog.objects.filter(error_type="model_version_not_ready")
    assert refused.exists()
    assert not refused.exclude(deployment_id=None).exists()
    assert not refused.exclude(model_version_id=None).exists()
