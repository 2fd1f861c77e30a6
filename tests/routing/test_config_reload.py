"""A deployment that becomes ready is routed to without restarting the proxy (config pub/sub)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from core.redis_client import publish_config_change
from routing.models import RequestLog
from tests.routing.conftest import Proc, make_tenant_key, post
from tests.routing.fleet import start_member

pytestmark = pytest.mark.django_db(transaction=True)
BODY = {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_new_ready_deployment_joins_the_pool(
    start_proxy: Callable[..., Proc], transactional_db: None
) -> None:
    first = start_member("llama")
    second = None
    try:
        tk = make_tenant_key()
        proxy = start_proxy()
        url = proxy.url + "/v1/chat/completions"
        assert post(url, tk.raw_key, BODY).status == 200
        second = start_member("llama")
        publish_config_change("deployment", id=second.deployment.pk, state="ready")
        time.sleep(0.5)
        for _ in range(6):
            assert post(url, tk.raw_key, BODY).status == 200
        deadline = time.monotonic() + 5
        while RequestLog.objects.count() < 7 and time.monotonic() < deadline:
            time.sleep(0.1)
        used = set(RequestLog.objects.values_list("deployment_id", flat=True))
        assert used == {first.deployment.pk, second.deployment.pk}
    finally:
        first.sim.stop()
        if second is not None:
            second.sim.stop()
