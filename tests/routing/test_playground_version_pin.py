"""The playground's request through the real `/v1/` path: a streamed chat that names a version
(`x-inferchain-version`, routing/proxy/pin.py) is answered by that version's engine, logged with its route
decision, under the key's tenant limits and alias scopes; a bad or unserved version is refused with an
OpenAI-shaped error naming the header as its `param`.

Two simulator versions of one alias, each with one ready deployment, behind a proxy process."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import openai
import pytest

from core.redis_client import publish_config_change
from models_registry.models import ModelAlias, ModelVersion
from routing.models import RequestLog, StageChain
from tests.routing.conftest import Proc, make_tenant_key, post
from tests.routing.fleet import FleetMember, ensure_alias, start_member
from tests.routing.rollouts import new_version

pytestmark = pytest.mark.django_db(transaction=True)

ALIAS = "llama-pg"
HEADER = "x-inferchain-version"


@dataclass
class TwoVersions:
    alias: ModelAlias
    v1: ModelVersion  # the active version
    v2: ModelVersion  # deployed under the alias, receives nothing unless pinned
    on_v1: FleetMember
    on_v2: FleetMember


@pytest.fixture
def two_versions(transactional_db: None, redis_clean: None) -> Iterator[TwoVersions]:
    alias = ensure_alias(ALIAS)
    v1 = alias.active_version
    v2 = new_version(alias, "awq")
    members = [start_member(ALIAS, version=v1), start_member(ALIAS, version=v2)]
    yield TwoVersions(alias, v1, v2, *members)
    for member in members:
        member.sim.stop()


def _rows(request_ids: list[str], timeout: float = 10.0) -> dict[str, RequestLog]:
    deadline = time.monotonic() + timeout
    while True:
        rows = {r.request_id: r for r in RequestLog.objects.filter(request_id__in=request_ids)}
        if len(rows) == len(set(request_ids)) or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)


def _stream(proxy: Proc, key: str, version: int | None) -> tuple[str, list[str]]:
    """One streamed chat; the request id and the text pieces in the order they arrived."""
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0, timeout=30)
    raw = client.chat.completions.with_raw_response.create(
        model=ALIAS,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}],
        max_tokens=12,
        temperature=0.2,
        stream=True,
        extra_headers={HEADER: str(version)} if version is not None else None,
    )
    pieces = [c.choices[0].delta.content or "" for c in raw.parse() if c.choices]
    return raw.headers["x-request-id"], [p for p in pieces if p]


def test_a_pinned_stream_is_answered_by_that_version_and_logged_with_its_route(
    start_proxy: Callable[..., Proc], two_versions: TwoVersions
) -> None:
    tk = make_tenant_key("acme")
    proxy = start_proxy()
    plain_id, _ = _stream(proxy, tk.raw_key, None)
    pinned_id, pieces = _stream(proxy, tk.raw_key, two_versions.v2.pk)
    active_id, _ = _stream(proxy, tk.raw_key, two_versions.v1.pk)
    assert len(pieces) > 1, "the answer streams in several chunks"

    rows = _rows([plain_id, pinned_id, active_id])
    # Without the header the alias's active version answers; with it, the version named.
    assert rows[plain_id].model_version_id == two_versions.v1.pk
    assert "pinned" not in rows[plain_id].route_reason
    pinned = rows[pinned_id]
    assert pinned.status == 200 and pinned.stream
    assert pinned.model_version_id == two_versions.v2.pk
    assert pinned.deployment_id == two_versions.on_v2.deployment.pk
    assert f"pinned version llama-3.1-8b@awq (id {two_versions.v2.pk})" in pinned.route_reason
    assert pinned.completion_tokens == 12 and pinned.ttft_ms is not None
    assert pinned.tenant_name == "acme" and pinned.key_prefix == tk.api_key.prefix
    assert rows[active_id].deployment_id == two_versions.on_v1.deployment.pk


def test_a_pinned_request_spends_the_tenants_limits(
    start_proxy: Callable[..., Proc], two_versions: TwoVersions
) -> None:
    tk = make_tenant_key("acme", requests_per_minute=1)
    proxy = start_proxy()
    body = {"model": ALIAS, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    headers = {HEADER: str(two_versions.v2.pk)}
    first = post(f"{proxy.url}/v1/chat/completions", tk.raw_key, body, headers=headers)
    assert first.status == 200, first.text
    second = post(f"{proxy.url}/v1/chat/completions", tk.raw_key, body, headers=headers)
    assert second.status == 429, second.text
    assert second.json()["error"]["type"] == "rate_limit_error"


def test_a_key_scoped_to_other_aliases_cannot_pin_a_version_of_this_one(
    start_proxy: Callable[..., Proc], two_versions: TwoVersions
) -> None:
    tk = make_tenant_key("acme", scopes=["llama-other"])
    proxy = start_proxy()
    body = {"model": ALIAS, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    reply = post(
        f"{proxy.url}/v1/chat/completions", tk.raw_key, body, headers={HEADER: str(two_versions.v2.pk)}
    )
    assert reply.status == 403, reply.text
    assert reply.json()["error"]["code"] == "model_not_allowed"


@pytest.mark.parametrize("value", ["abc", "0", "-3", "1.5"])
def test_a_malformed_version_is_a_field_error(
    start_proxy: Callable[..., Proc], two_versions: TwoVersions, value: str
) -> None:
    tk = make_tenant_key("acme")
    proxy = start_proxy()
    body = {"model": ALIAS, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    reply = post(f"{proxy.url}/v1/chat/completions", tk.raw_key, body, headers={HEADER: value})
    assert reply.status == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == HEADER and error["code"] == "invalid_version"


def test_a_version_the_alias_does_not_serve_is_refused_never_replaced(
    start_proxy: Callable[..., Proc], two_versions: TwoVersions
) -> None:
    undeployed = new_version(two_versions.alias, "v3")
    tk = make_tenant_key("acme")
    proxy = start_proxy()
    body = {"model": ALIAS, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    reply = post(f"{proxy.url}/v1/chat/completions", tk.raw_key, body, headers={HEADER: str(undeployed.pk)})
    assert reply.status == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == HEADER and error["code"] == "version_not_served"
    # The message names what the alias does serve, so the caller can pick one.
    assert f"llama-3.1-8b@awq (id {two_versions.v2.pk})" in error["message"]
    assert f"llama-3.1-8b@main (id {two_versions.v1.pk})" in error["message"]
    [row] = _rows([reply.headers["x-request-id"]]).values()
    assert row.status == 400 and row.deployment_id is None and row.error_type == "version_not_served"


def test_a_cached_answer_of_one_version_never_answers_a_request_pinned_to_another(
    start_proxy: Callable[..., Proc], two_versions: TwoVersions
) -> None:
    tk = make_tenant_key("acme")
    StageChain.objects.create(
        name="cached", alias=ALIAS, stages=[{"kind": "cache", "name": "answers"}, {"kind": "generate"}]
    )
    publish_config_change("stage_chain")
    proxy = start_proxy()
    body = {
        "model": ALIAS,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "temperature": 0,
    }
    url = f"{proxy.url}/v1/chat/completions"
    deadline = time.monotonic() + 10
    while post(url, tk.raw_key, body).headers.get("x-inferchain-cache") != "hit":
        assert time.monotonic() < deadline, "the proxy never took the chain"
        time.sleep(0.1)
    # Unpinned, the entry answers; pinned to the other version, the same body misses and that version
    # answers; pinned again, it hits that version's own entry.
    pinned = {HEADER: str(two_versions.v2.pk)}
    first = post(url, tk.raw_key, body, headers=pinned)
    assert first.status == 200 and first.headers["x-inferchain-cache"] == "miss", first.text
    assert post(url, tk.raw_key, body, headers=pinned).headers["x-inferchain-cache"] == "hit"
    row = _rows([first.headers["x-request-id"]])[first.headers["x-request-id"]]
    assert row.model_version_id == two_versions.v2.pk
