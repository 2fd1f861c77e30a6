"""End-to-end helpers: the real ASGI app in a subprocess on the test database, and Debian's Chromium.

Fixtures in conftest.py wrap these; tests import the helpers: `from tests.e2e.harness import login`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.conf import settings
from django.db import connection

from tests.ports import free_port

REPO_ROOT = Path(settings.BASE_DIR)
CHROMIUM = Path("/usr/bin/chromium")
FRONTEND_INDEX = Path(settings.FRONTEND_DIST) / "index.html"
SCREENSHOT_DIR = REPO_ROOT / "test-artifacts" / "screenshots"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
READY_TIMEOUT_S = 40.0


@dataclass
class LiveConsole:
    """A running console: `url` is http://127.0.0.1:<port> (the SPA, /api/, /v1/); `ws_url` the same for ws://."""

    url: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    env: dict[str, str] = field(repr=False)

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def require_chromium() -> None:
    """Fail (never skip) when the browser is missing: the e2e tests are part of `make test`."""
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing. Install Debian's Chromium with `make chromium` "
            "(the e2e tests drive it through Playwright and never download a browser)."
        )


def require_frontend_build() -> None:
    """Fail when the console is not built, or built from older sources than the ones checked out."""
    if not FRONTEND_INDEX.exists():
        pytest.fail(f"{FRONTEND_INDEX} is missing. Build the console first: `make frontend`.")
    built_at = FRONTEND_INDEX.stat().st_mtime
    sources = (REPO_ROOT / "frontend" / "src").rglob("*")
    stale = [p for p in sources if p.is_file() and p.stat().st_mtime > built_at]
    if stale:
        pytest.fail(
            f"frontend/dist is older than {stale[0].relative_to(REPO_ROOT)}. Rebuild it: `make frontend`."
        )


def subprocess_database_url() -> str:
    """DATABASE_URL of the database this pytest run created, for a subprocess to share it."""
    db = connection.settings_dict
    if connection.vendor != "postgresql":
        pytest.fail("End-to-end tests need PostgreSQL: run pytest with DATABASE_URL=postgres://…")
    user = quote(str(db.get("USER") or ""), safe="")
    password = quote(str(db.get("PASSWORD") or ""), safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = db.get("HOST") or "127.0.0.1"
    port = db.get("PORT") or 5432
    return f"postgres://{auth}{host}:{port}/{quote(str(db['NAME']), safe='')}"


def start_console(log_dir: Path, extra_env: dict[str, str] | None = None) -> LiveConsole:
    """Start `uvicorn inferchain.asgi:application` on a free loopback port against this run's test database.

    The subprocess shares the test process's database, Redis key prefix and secrets, so objects created
    with the ORM in a test (users, tenants, keys) are valid in the served app. Call `.stop()` when done.
    """
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "inferchain.settings",
        "DATABASE_URL": subprocess_database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "REDIS_KEY_PREFIX": settings.REDIS_KEY_PREFIX,
        "SECRET_KEY": settings.SECRET_KEY,
        "API_KEY_HMAC_SECRET": settings.API_KEY_HMAC_SECRET,
        "PYTHONUNBUFFERED": "1",
        **(extra_env or {}),
    }
    env.pop("TEST_DATABASE_NAME", None)
    if "DJANGO_ALLOW_ASYNC_UNSAFE" not in (extra_env or {}):
        env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)  # the server keeps Django's async-safety checks
    log_path = log_dir / f"console-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "inferchain.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    console = LiveConsole(url=url, port=port, process=process, log_path=log_path, env=env)
    try:
        wait_until_ready(console)
    except BaseException:
        console.stop()
        raise
    return console


def wait_until_ready(console: LiveConsole) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    last_error = ""
    while time.monotonic() < deadline:
        if console.process.poll() is not None:
            pytest.fail(f"The console exited with {console.process.returncode}:\n{console.log_tail()}")
        try:
            with urllib.request.urlopen(f"{console.url}/api/auth/csrf/", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError) as exc:
            last_error = str(exc)
        time.sleep(0.2)
    pytest.fail(
        f"The console did not answer within {READY_TIMEOUT_S:.0f}s ({last_error}):\n{console.log_tail()}"
    )


def login(page: Any, username: str, password: str) -> None:
    """Sign in through the login page of the page's console (its base URL) and wait for the layout."""
    from playwright.sync_api import expect

    page.goto("/login")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_test_id("current-user")).to_contain_text(username)


def screenshot(page: Any, name: str, *, full_page: bool = True, **options: Any) -> Path:
    """Save test-artifacts/screenshots/<name>.png (gitignored) and return its path.

    Use full_page=False while a modal is open: its backdrop covers only the viewport.
    """
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOT_DIR / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page, **options)
    return path
