"""Fixtures shared by every test package: users of each role and API clients signed in as them."""

from __future__ import annotations

import signal
import warnings
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


def _transactional(request: pytest.FixtureRequest) -> bool:
    marker = request.node.get_closest_marker("django_db")
    flags = (marker.kwargs.get("transaction"), marker.kwargs.get("reset_sequences")) if marker else ()
    return any(flags) or "transactional_db" in request.fixturenames or "live_server" in request.fixturenames


@pytest.fixture(autouse=True)
def _signal_mask_kept(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that leaves signals blocked in the worker's main thread is named, and the mask restored.

    Blocked signals are inherited by every process the worker starts afterwards: one CI run's
    scripts/run_logged.py test found SIGTERM blocked and its command deaf to it, long after whatever
    blocked it had passed."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    after = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    if after != before:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        left = sorted(signal.Signals(s).name for s in after - before)
        warnings.warn(f"{request.node.nodeid} left {left} blocked in the main thread; restored", stacklevel=1)


@pytest.fixture(autouse=True)
def _quiet_database_before_flush(request: pytest.FixtureRequest) -> Iterator[None]:
    """A transactional test ends with its live server shut and idle and no other session on its database
    in a transaction, before pytest-django's flush (tests/before_flush.py says why).

    Autouse, so its teardown runs after the test's own fixtures' (which stop its agents, engines and
    servers); the database fixture is set up first so that its flush comes after this teardown."""
    if not _transactional(request):
        yield
        return
    from tests.before_flush import gate, wait_until_quiet

    if "transactional_db" in request.fixturenames:
        request.getfixturevalue("transactional_db")
    app = gate(request.getfixturevalue("live_server")) if "live_server" in request.fixturenames else None
    if app is not None:
        app.reopen()
    yield
    if app is not None:
        app.shut_and_drain()
    wait_until_quiet()


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
