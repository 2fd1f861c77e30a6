"""Fixtures for end-to-end tests: `live_console` (the real ASGI app) and `browser_page` (headless Chromium).

Use them as:

    @pytest.mark.e2e
    def test_something(browser_page, admin_user):  # browser_page starts live_console itself
        login(browser_page, admin_user.username, PASSWORD)
        browser_page.goto("/tenants")
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from tests.e2e.harness import (
    CHROMIUM,
    CHROMIUM_ARGS,
    LiveConsole,
    require_chromium,
    require_frontend_build,
    start_console,
)


@pytest.fixture
def live_console(transactional_db: None, tmp_path: Path) -> Iterator[LiveConsole]:
    """uvicorn inferchain.asgi:application on a free port, sharing this test's database and Redis prefix.

    `transactional_db` (not `db`): rows the test commits must be visible to the server process.
    """
    require_frontend_build()
    console = start_console(tmp_path)
    yield console
    console.stop()


@pytest.fixture
def browser_page(
    live_console: LiveConsole, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[Any]:
    """A Playwright page in Debian's headless Chromium with a fresh profile; never downloads a browser.

    Its base URL is the live console, so `page.goto("/tenants")` works. Its time zone is UTC, or the one
    a test names with `@pytest.mark.browser_timezone("Europe/Berlin")`.
    """
    zone = request.node.get_closest_marker("browser_timezone")
    require_chromium()
    # Playwright's sync API keeps an event loop running in this thread; the ORM calls a test makes between
    # browser steps are still plain synchronous calls in one thread, so Django's async guard does not apply.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import expect, sync_playwright

    # Assertions wait as long as actions do. Playwright's own 5 s suits a quiet machine; `make test` runs
    # two workers on two cores, each with a live console, proxies and engines, and a page that answers in
    # 0.3 s alone has taken over 5 s there (a filter's total, 2026-12-07). A wait that ends early passes
    # early; only a real fault waits out the 15 s.
    expect.set_options(timeout=15_000)

    profile = Path(tempfile.mkdtemp(prefix="chromium-profile-", dir=tmp_path))
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            base_url=live_console.url,
            viewport={"width": 1280, "height": 860},
            # Fixed zone and locale: tests type and read dates, which the console shows in the browser's zone.
            timezone_id=zone.args[0] if zone else "UTC",
            locale="en-US",
        )
        context.set_default_timeout(15_000)
        page = context.pages[0] if context.pages else context.new_page()
        try:
            yield page
        finally:
            # ORM calls made while Playwright runs get their own connection (greenlets carry their own
            # contextvars); close it here, or it outlives the test and blocks dropping the test database.
            connections.close_all()
            context.close()
            shutil.rmtree(profile, ignore_errors=True)
