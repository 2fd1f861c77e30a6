"""Fixtures shared by every test package: users of each role and API clients signed in as them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from console.choices import Role
from console.models import User
from core.redis_client import get_redis

PASSWORD = "correct-horse-battery-9"
# Where the watchdog keeps each worker's stack dump (var/ is the checkout's scratch space, not committed).
STACKS_DIR = Path(__file__).resolve().parent.parent / "var" / "test-logs"


def pytest_configure(config: pytest.Config) -> None:
    from tests.keyleak import KeyLeakCheck
    from tests.watchdog import Watchdog

    # Every raw key the suite creates is looked for in captured output, process lists and logs.
    if not config.pluginmanager.has_plugin("keyleak"):
        config.pluginmanager.register(KeyLeakCheck(), "keyleak")
    # A test that hangs fails at its timeout with every thread's stack in its report.
    if not config.pluginmanager.has_plugin("watchdog"):
        config.pluginmanager.register(Watchdog(STACKS_DIR), "watchdog")


def make_user(username: str, role: str) -> User:
    user = User(username=username, role=role)
    user.set_password(PASSWORD)
    user.save()
    return user


@pytest.fixture
def admin_user(db: None) -> User:
    return make_user("alice-admin", Role.ADMIN)


@pytest.fixture
def evaluator_user(db: None) -> User:
    return make_user("eve-evaluator", Role.EVALUATOR)


@pytest.fixture
def viewer_user(db: None) -> User:
    return make_user("victor-viewer", Role.VIEWER)


def client_for(user: User | None) -> APIClient:
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)
    return client


@pytest.fixture
def admin_client(admin_user: User) -> APIClient:
    return client_for(admin_user)


@pytest.fixture
def evaluator_client(evaluator_user: User) -> APIClient:
    return client_for(evaluator_user)


@pytest.fixture
def viewer_client(viewer_user: User) -> APIClient:
    return client_for(viewer_user)


@pytest.fixture
def anon_client() -> APIClient:
    return APIClient()


def wipe_run_keys() -> None:
    """Delete this run's Redis keys (they share REDIS_KEY_PREFIX), never another run's or worker's."""
    r = get_redis()
    for key in r.scan_iter(match=f"{settings.REDIS_KEY_PREFIX}*", count=500):
        r.delete(key)


@pytest.fixture
def redis_clean() -> Iterator[None]:
    """Real Redis, with this run's keys removed before and after."""
    wipe_run_keys()
    yield
    wipe_run_keys()
