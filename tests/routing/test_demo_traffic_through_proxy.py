"""The demo traffic (manage.py demo_traffic) goes through the proxy with the demo-traffic key: it is
authenticated, routed and logged like any client's, under a tenant of its own that the request-log API
shows."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from console.models import ApiKey
from console.services import revoke_api_key
from inferchain.demo_traffic import DemoTraffic, run_demo_traffic
from routing.demo import DEMO_ALIAS, DEMO_TRAFFIC_TENANT, seed_demo_traffic
from routing.models import RequestLog
from tests.routing.conftest import Proc
from tests.routing.fleet import FleetMember, start_member

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def engine(transactional_db: None, redis_clean: None) -> Iterator[FleetMember]:
    # Long enough for the demo's long documents (up to ~9,500 tokens).
    member = start_member(DEMO_ALIAS, max_model_len=16384, time_scale=200.0)
    yield member
    member.sim.stop()


def test_demo_traffic_is_logged_under_its_own_tenant(
    start_proxy: Callable[..., Proc], engine: FleetMember, tmp_path: Path, admin_client: APIClient
) -> None:
    key_file = tmp_path / "demo-traffic.key"
    seed_demo_traffic(key_file)
    proxy = start_proxy()
    stop = threading.Event()
    sender = threading.Thread(target=run_demo_traffic, args=(20.0, stop, proxy.url + "/v1", key_file))
    sender.start()
    try:
        deadline = time.monotonic() + 30
        while RequestLog.objects.filter(status=200).count() < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop.set()
        sender.join(10)
    rows = list(RequestLog.objects.filter(status=200))
    assert len(rows) >= 3
    key = ApiKey.objects.get(tenant__name=DEMO_TRAFFIC_TENANT, revoked_at__isnull=True)
    assert {(r.tenant_name, r.key_prefix, r.alias) for r in rows} == {
        (DEMO_TRAFFIC_TENANT, key.prefix, DEMO_ALIAS)
    }
    assert {r.deployment_id for r in rows} == {engine.deployment.pk}
    listed = admin_client.get("/api/request-log/", {"tenant_id": key.tenant_id}).json()["results"]
    assert listed and {row["tenant_name"] for row in listed} == {DEMO_TRAFFIC_TENANT}


def test_a_revoked_demo_traffic_key_stops_the_traffic_until_a_new_one(
    start_proxy: Callable[..., Proc], engine: FleetMember, tmp_path: Path
) -> None:
    key_file = tmp_path / "demo-traffic.key"
    seed_demo_traffic(key_file)
    proxy = start_proxy()
    traffic = DemoTraffic(proxy.url + "/v1", key_file)
    traffic.refresh()
    assert traffic.models == [DEMO_ALIAS] and traffic.key is not None
    revoke_api_key(ApiKey.objects.get(tenant__name=DEMO_TRAFFIC_TENANT), actor=None)
    traffic.in_flight = 1
    traffic.send(DEMO_ALIAS, random.Random(1))
    assert traffic.refused and traffic.in_flight == 0
    seed_demo_traffic(key_file)  # a new `make run` rotates the key and the file
    traffic.refresh()
    assert not traffic.refused
