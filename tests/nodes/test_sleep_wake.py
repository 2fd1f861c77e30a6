"""Sleep after idle, wake on request and scale to zero, with real simulator engines launched by the
agent's own code, the agent's supervisor loop and a real proxy (held requests through `openai`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from core.celery import app
from core.redis_client import publish_config_change
from nodes.agent import runtime
from nodes.choices import DeploymentState
from nodes.lifecycle import engine_api_key
from nodes.models import Deployment
from nodes.probes import get_json, http_get
from routing.models import RoutePool
from routing.scaling.sleep import sleep_idle_engines
from tests.nodes.conftest import READY, supervisor_for, tick_until

# start_proxy is the routing tests' fixture (a proxy process), used here by name.
from tests.routing.conftest import Proc, make_tenant_key, start_proxy  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
ALIAS = "llama-3.1-8b"


@pytest.fixture
def eager_tasks() -> Iterator[None]:
    """Agent tasks run in the test's process when queued (there is no worker here)."""
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


def _launch_all(host: Any, deployments: list[Deployment]) -> Any:
    supervisor = supervisor_for(host)
    supervisor.start()
    for d in deployments:
        assert runtime.launch(d.pk) == "started"
    for d in deployments:
        tick_until(supervisor, d, READY)
    supervisor.start_loop()
    return supervisor


def _state(d: Deployment) -> str:
    d.refresh_from_db()
    return d.state


def _chat(client: openai.OpenAI) -> str:
    reply = client.chat.completions.create(
        model=ALIAS, messages=[{"role": "user", "content": "hello"}], max_tokens=4
    )
    return reply.choices[0].message.content or ""


def test_sleep_after_idle_then_a_request_wakes_it(
    host: Any,
    make_deployment: Any,
    start_proxy: Callable[..., Proc],  # noqa: F811
    redis_clean: None,
    eager_tasks: None,
) -> None:
    dep = make_deployment(sleep_idle_seconds=1, sleep_level=1, sleep_enabled=True)
    supervisor = _launch_all(host, [dep])
    try:
        dep.refresh_from_db()
        assert "--enable-sleep-mode" in dep.launch_argv
        # The dev endpoints are there, and only for the agent's key (vLLM leaves them unguarded).
        assert http_get("127.0.0.1", dep.port, "/is_sleeping", timeout=2).status == 401
        assert http_get("127.0.0.1", dep.port, "/sleep", timeout=2, method="POST").status == 401
        assert get_json("127.0.0.1", dep.port, "/is_sleeping", timeout=2, api_key=engine_api_key(dep)) == {
            "is_sleeping": False
        }
        proxy = start_proxy()
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=make_tenant_key().raw_key, max_retries=0)
        assert _chat(client)  # awake: served at once
        time.sleep(0.5)  # the agent's next ticks see the tokens it generated
        assert sleep_idle_engines() == []  # it was just busy
        time.sleep(1.5)
        assert sleep_idle_engines() == [dep.pk]
        dep.refresh_from_db()
        assert dep.state == DeploymentState.SLEEPING and dep.sleeping_level == 1
        gpu = get_json("127.0.0.1", dep.port, "/sim/gpu", timeout=2, api_key=engine_api_key(dep))["gpus"][0]
        assert gpu["sleep_level"] == 1 and gpu["offloaded_bytes"] > 0
        time.sleep(0.5)  # the proxy's snapshot follows the state change (pub/sub, then a reload)
        # The first request is held while the agent wakes the engine, then served.
        assert _chat(client)
        assert _state(dep) == DeploymentState.READY
        messages = list(dep.events.values_list("message", flat=True))
        assert any("woken on request" in m for m in messages), messages
    finally:
        supervisor.close()


def test_scale_to_zero_and_back_then_timeout_with_retry_after(
    host: Any,
    make_deployment: Any,
    start_proxy: Callable[..., Proc],  # noqa: F811
    redis_clean: None,
    eager_tasks: None,
) -> None:
    pool = RoutePool.objects.create(
        name=ALIAS, alias=ALIAS, sleep_idle_seconds=1, scale_to_zero=True, wake_timeout_s=20
    )
    deps = [make_deployment(sleep_enabled=True) for _ in range(2)]
    supervisor = _launch_all(host, deps)
    try:
        time.sleep(1.5)
        assert sorted(sleep_idle_engines()) == sorted(d.pk for d in deps)
        assert [_state(d) for d in deps] == [DeploymentState.SLEEPING] * 2
        proxy = start_proxy()  # starts with every engine asleep
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=make_tenant_key().raw_key, max_retries=0)
        assert [m.id for m in client.models.list()] == [ALIAS]  # listed while every engine sleeps
        assert _chat(client)
        states = sorted(_state(d) for d in deps)
        assert states == [DeploymentState.READY, DeploymentState.SLEEPING]  # one woke, not both
    finally:
        supervisor.close()
    # Nobody wakes engines any more (the agent is gone): the held request times out with Retry-After.
    awake = next(d for d in deps if _state(d) == DeploymentState.READY)
    assert runtime.sleep(awake.pk, 2) == "asleep"
    RoutePool.objects.filter(pk=pool.pk).update(wake_timeout_s=0.5)
    publish_config_change("route_pool")
    time.sleep(0.5)
    began = time.monotonic()
    with pytest.raises(openai.APIStatusError) as caught:
        _chat(client)
    assert time.monotonic() - began < 5
    err = caught.value
    assert err.status_code == 503 and err.response.headers["retry-after"] == "1"
    assert err.response.json()["error"]["code"] == "engine_waking"
    # A request no sleeper could take (past max_model_len) is refused at once, not held.
    with pytest.raises(openai.BadRequestError) as too_long:
        client.chat.completions.create(
            model=ALIAS, messages=[{"role": "user", "content": "hello"}], max_tokens=5000
        )
    assert too_long.value.status_code == 400
