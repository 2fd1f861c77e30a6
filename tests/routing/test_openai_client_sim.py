"""The official openai client against simulator engines through the proxy: chat, completions, streams."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import openai
import pytest

from routing.models import RequestLog
from tests.routing.conftest import Proc, make_tenant_key
from tests.routing.fleet import FleetMember, start_member

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def two_sims(transactional_db: None) -> Iterator[list[FleetMember]]:
    members = [start_member("llama") for _ in range(2)]
    yield members
    for member in members:
        member.sim.stop()


def test_client_calls_fleet_through_proxy(
    start_proxy: Callable[..., Proc], two_sims: list[FleetMember]
) -> None:
    tk = make_tenant_key()
    proxy = start_proxy()
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0)
    assert [m.id for m in client.models.list()] == ["llama"]
    chat = client.chat.completions.create(
        model="llama", messages=[{"role": "user", "content": "Say hi"}], max_tokens=16
    )
    assert chat.choices[0].message.content and chat.usage and chat.usage.prompt_tokens > 0
    text = client.completions.create(model="llama", prompt="Once upon a time", max_tokens=8)
    assert text.choices[0].text
    chunks = list(
        client.chat.completions.create(
            model="llama", messages=[{"role": "user", "content": "Count"}], max_tokens=12, stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    deadline = time.monotonic() + 5
    while RequestLog.objects.count() < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    rows = list(RequestLog.objects.all())
    fleet_ids = {m.deployment.pk for m in two_sims}
    assert len(rows) == 3 and all(r.deployment_id in fleet_ids and r.status == 200 for r in rows)
    # least_outstanding with ties broken round-robin spreads sequential requests over both engines.
    assert len({r.deployment_id for r in rows}) == 2


def test_prompt_longer_than_max_model_len_refused_before_engine(
    start_proxy: Callable[..., Proc], transactional_db: None
) -> None:
    member = start_member("llama", max_model_len=256)
    try:
        tk = make_tenant_key()
        proxy = start_proxy()
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=tk.raw_key, max_retries=0)
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(
                model="llama", messages=[{"role": "user", "content": "lorem ipsum " * 400}]
            )
        assert "maximum context length" in str(err.value)
        deadline = time.monotonic() + 5
        while not RequestLog.objects.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        row = RequestLog.objects.get()
        # Refused by the proxy's own count: no endpoint was ever chosen for it.
        assert row.status == 400 and row.error_type == "context_length_exceeded"
        assert row.deployment_id is None
    finally:
        member.sim.stop()
