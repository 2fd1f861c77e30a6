"""The demo routing seed is idempotent and its rules parse."""

from __future__ import annotations

import pytest

from routing.demo import seed_demo_routing
from routing.models import RoutePolicy, RoutePool
from routing.proxy.config import parse_rule

pytestmark = pytest.mark.django_db


def test_seed_twice_creates_once() -> None:
    seed_demo_routing()
    seed_demo_routing()
    assert RoutePool.objects.count() == 2
    policy = RoutePolicy.objects.get()
    assert [parse_rule(r).pool for r in policy.rules] == ["llama-long", "llama-fast"]
    assert policy.fallback_pool is not None and policy.fallback_pool.name == "llama-long"
